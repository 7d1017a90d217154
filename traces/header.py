"""A trace's header: `TraceMeta`, what a plan was built from, where it ran and what measured it.

    from traces.header import TraceMeta
    meta = TraceMeta(model=model, layout=layout, world=layout.world)
    timed = dataclasses.replace(meta, timed=True)

Every field is typed and None where the trace does not say (a profiler import names no model,
a plan no backend). `fold` is the `Layout` a folded plan was folded with (one rank per pipeline
stage standing for its tensor-parallel peers and data-parallel replicas), read once when the
file is read. `fold_classes` are the classes of a plan folded by identity (`traces.identity`:
skewed expert loads, an expert grid the shifts do not map onto itself, network positions, a
fold over CP): the ranks each representative stands for, which neither the layout nor the
ranks held say. `cluster_spec` is the `ClusterTable` that rebuilds the cluster a plan was
simulated on or a run measured on (`topology.config.read_cluster_table`); `cluster_name` is
only its display label. `extras` keeps what a foreign or newer file holds beyond these fields.
`traces.header_json` converts the header to and from the trace file's "meta" object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from traces.cluster_table import ClusterTable, TableValue
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec

__all__ = ["FOLD_AXES", "ClusterTable", "FoldClasses", "TableValue", "TraceMeta",
           "check_fold_ranks"]

FOLD_AXES = ("tp", "dp")
"""The axes a folded plan collapses: peers along them run the same program."""

@dataclass(frozen=True, slots=True)
class FoldClasses:
    """The classes of a plan folded by identity (`traces.identity.Partition` without its
    layout, which is the meta's): `rep_of[r]` is the representative that stands for rank r,
    `cp_step` the cp shift a fold over CP maps the classes by (0: none, `traces.cp_fold`).
    The lowering adds a representative's copies by them (`traces.symmetry.copies`); read
    from a trace, they make its replay the simulation that wrote it."""

    rep_of: tuple[int, ...]
    cp_step: int = 0

    def representatives(self) -> list[int]:
        return sorted(set(self.rep_of))


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceMeta:
    """A trace's header (see the module docstring). Ranks key the per-rank tables."""

    # --- the plan (traces.plan.build)
    model: ModelSpec | None = None
    layout: Layout | None = None
    world: int | None = None
    """Ranks of the plan's (or the measured run's) world."""
    fold: Layout | None = None
    """The layout a folded plan was folded with; None for a plan of every rank."""
    fold_classes: FoldClasses | None = None
    """The classes a plan folded by identity holds one rank of (`sim.simulate.predict`);
    None: the uniform fold of `fold`, or no fold."""
    # --- the simulation (sim.simulate.predict, sim.engine.replay)
    experiment: str | None = None
    cluster_name: str | None = None
    """The cluster's display name ("dgx-a100 x128 fat-tree"): a label, never parsed."""
    cluster_spec: ClusterTable | None = None
    network: str | None = None
    timed: bool | None = None
    memory: Mapping[int, tuple[tuple[float, float], ...]] | None = None
    """Per rank, (time_s, bytes) points of its memory over the step
    (`sim.report.timeline.annotate`)."""
    devices: str | None = None
    """The word for the devices in displays: "GPUs", "chips", "CPU ranks"."""
    # --- a profiler import (traces.kineto)
    source: str | None = None
    """"kineto" for a PyTorch-profiler import."""
    world_size: int | None = None
    """The profiled job's world, which may exceed the ranks present."""
    ranks: tuple[int, ...] | None = None
    # --- a measured run (executor.recorder)
    measured: bool | None = None
    host: str | None = None
    platform: str | None = None
    torch: str | None = None
    backend: str | None = None
    """The torch.distributed backend: "gloo", "nccl"."""
    config: Mapping[str, Any] | None = None
    """The run's settings as JSON (model, layout, steps, seed...; a bench's sweep)."""
    complete: bool | None = None
    """False when some op was not recorded (a failed rank)."""
    error: str | None = None
    clock: str | None = None
    step_seconds: tuple[float, ...] | None = None
    peak_memory_bytes: Mapping[int, int] | None = None
    clock_offsets_ns: Mapping[int, int] | None = None
    clock_error_ns: Mapping[int, int] | None = None
    host_probe: Mapping[str, Any] | None = None
    """All-reduces over the world at a few sizes after the steps (`executor.probe`, JSON)."""
    # --- a profiler import's findings (traces.kineto)
    process_groups: Mapping[int, Any] | None = None
    """Per rank, its process groups as the profiler lists them (JSON)."""
    files: Mapping[int, str] | None = None
    compute_from: str | None = None
    num_group_assumed: int | None = None
    num_size_unknown: int | None = None
    skipped: Mapping[str, int] | None = None
    # --- a microbenchmark plan (traces.bench)
    bench: Mapping[str, Any] | None = None
    """Its version and sections (JSON), read by `traces.bench.sections`."""
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Entries a foreign or newer file holds that parasim does not read (JSON as found)."""

    @property
    def folded(self) -> bool:
        return self.fold is not None

    @property
    def folded_by(self) -> Layout | FoldClasses | None:
        """What the plan's ranks were folded by: the classes of a fold by identity, else the
        uniform fold's layout (None: no fold); `check_fold_ranks` checks the ranks against it."""
        return self.fold_classes or self.fold

    @property
    def kineto(self) -> bool:
        """Imported from a PyTorch-profiler trace."""
        return self.source == "kineto"


def check_fold_ranks(fold: Layout | FoldClasses | None, ranks: Iterable[int],
                     source: str = "trace") -> None:
    """A folded plan holds exactly its fold's representatives (the union of a run's files
    does; one file of it may hold fewer, so the reader does not check this): one per pipeline
    stage (`fold`, a layout), or one per class (`meta.fold_classes`)."""
    if fold is None:
        return
    held, expected = sorted(ranks), fold.representatives()
    if held != expected:
        where, each = ("meta.fold.layout", "one per pipeline stage") \
            if isinstance(fold, Layout) else ("meta.fold_classes", "one per class")
        raise ConfigError(f"{source}: {where}: folds onto ranks {_ranks(expected)} ({each}), "
                          f"but the trace holds ranks {_ranks(held)}")


def _ranks(ranks: list[int]) -> str:
    """A rank list for an error line: the first few, then how many in all."""
    if len(ranks) <= 6:
        return str(ranks)
    return f"[{', '.join(map(str, ranks[:4]))}, ... ({len(ranks):,} in all)]"
