"""The captured job of `parasim whatif`: its traces read and checked as one job, the config
that job ran, and the target experiment (that config with `--set` over it, or `--config`).

    captured = load_captured(["runs/dp2"])
    target = target_experiment(captured, settings=parse_settings(["parallel.dp=4"]))

A parasim trace set (`parasim run`) states its job in its header (`meta.model`,
`meta.layout`, `meta.cluster_spec`); a PyTorch-profiler trace states none, so its job comes
from `--job job.toml` and the trace is checked against it (its world, its kernels).
Several TRACE arguments are repeated captures of one job: their samples are pooled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sim.config import DERIVED_MODEL_KEYS, Experiment, experiment_from_dict
from sim.measured import LoadedTrace, load_trace
from sim.settings import Setting, apply_settings, load_config, named_as_flags
from traces.errors import ConfigError
from traces.model import ModelSpec
from traces.ops import OpKind, Trace
from traces.purpose import KernelRun


@dataclass(frozen=True, slots=True)
class Captured:
    """The traces of one captured job and the `[model]`/`[parallel]`/`[cluster]` it ran."""

    loaded: tuple[LoadedTrace, ...]
    job: dict[str, Any]
    """The job's config tables, as `sim.config.experiment_from_dict` reads them."""
    drew: bool
    """Whether the run drew random numbers (dropout): an executor run with dropout off draws
    none, and its ops say so (`draws` 0)."""
    predicted: bool = False
    """The traces are parasim's own simulated steps (`simulate`'s saved, `export --chakra`'s),
    not a run's: their communication times are the cluster's figures, not measurements."""

    @property
    def first(self) -> Trace:
        return self.loaded[0].trace

    @property
    def traces(self) -> list[Trace]:
        return [lt.trace for lt in self.loaded]


def load_captured(paths: Sequence[str], job_toml: str | None = None) -> Captured:
    """Read every TRACE; one line and exit 2 if they are of different jobs, hold no kernels
    of a plan, or are profiler traces without `--job` (or not of that job)."""
    if not paths:
        raise ConfigError("TRACE: give at least one captured trace")
    loaded = tuple(load_trace(p) for p in paths)
    given = _job_of_toml(job_toml) if job_toml is not None else None
    jobs = [given if given is not None else _job_of_header(lt) for lt in loaded]
    for lt, job in zip(loaded[1:], jobs[1:]):
        if job != jobs[0]:
            raise ConfigError(f"TRACE: {lt.path} is a trace of another job than "
                              f"{loaded[0].path} (its model, layout or cluster differ)")
    for lt in loaded:
        if given is not None:
            _check_world(lt, given)
        _check_kernels(lt)
    config = loaded[0].trace.meta.config or {}
    return Captured(loaded, jobs[0], drew=config.get("dropout", 1) != 0,
                    predicted=all(map(_predicted, loaded)))


def _predicted(lt: LoadedTrace) -> bool:
    """A step parasim simulated (`sim.measured.replay_trace`'s rule): a parasim or Chakra
    trace that names its network and no run's clock nor completion."""
    meta = lt.trace.meta
    return (lt.source in ("parasim", "chakra") and meta.network is not None
            and meta.complete is None and meta.clock is None)


def _job_of_header(lt: LoadedTrace) -> dict[str, Any]:
    """The job a parasim trace's header states; a profiler trace states none."""
    meta = lt.trace.meta
    if lt.source not in ("parasim", "chakra") or meta.model is None or meta.layout is None:
        raise ConfigError(f"TRACE: {lt.path} does not state its job (a profiler trace, or a "
                          "Chakra trace parasim did not export); give "
                          "--job job.toml with its [model], [parallel] and [cluster]")
    if meta.cluster_spec is None:
        raise ConfigError(f"TRACE: {lt.path} names no cluster it ran on; give --job "
                          "job.toml with its [model], [parallel] and [cluster]")
    return {"model": model_table(meta.model), "parallel": meta.layout.to_dict(),
            "cluster": meta.cluster_spec.table()}


def model_table(model: ModelSpec) -> dict[str, Any]:
    """The fewest `[model]` keys that give `model` back: the ones off their default, less
    those the others imply (ffn_hidden, head_dim, kv_heads), so `--set model.hidden=...`
    moves what follows from it."""
    table = {f.name: getattr(model, f.name) for f in fields(ModelSpec)
             if getattr(model, f.name) != f.default}
    for derived in DERIVED_MODEL_KEYS:  # not config keys: the config derives them
        table.pop(derived, None)
    for name in list(table):
        rest = {k: v for k, v in table.items() if k != name}
        try:
            implied = ModelSpec(**rest) == model
        except (TypeError, ValueError, ConfigError):  # a required key, or not alone valid
            implied = False
        if implied:
            table = rest
    return table


def _job_of_toml(path: str) -> dict[str, Any]:
    data = load_config(path, [])
    job: dict[str, Any] = {k: data[k] for k in ("model", "parallel", "cluster") if k in data}
    experiment_from_dict(job, name=Path(path).stem)  # checked now: one line if not a job
    return job


def _check_kernels(lt: LoadedTrace) -> None:
    """A trace to learn from holds timed kernels of a plan (a parasim trace's kernel runs)."""
    for ops in lt.trace.ops.values():
        for op in ops:
            if op.kind is OpKind.COMPUTE and op.end is not None and \
                    isinstance(op.purpose, KernelRun):
                return
    raise ConfigError(f"TRACE: {lt.path} holds no timed kernels of a plan to learn kernel "
                      f"times from ({_what_ran(lt.trace)})")


FAMILIES = (  # (kernel name parts, what a job running them is), from the shipped A100 traces
    (("ImplicitGemmConvolution", "implicit_gemm", "bn_fw_tr_", "bn_bw_", "nchwToNhwc"),
     "cuDNN convolutions and batch norm: a CNN"),
    (("split_embedding_",), "fbgemm embedding-table lookups: a recommendation model"),
)
"""Kernels that show a job is no transformer parasim plans (`docs/whatif.md`)."""


def _what_ran(trace: Trace) -> str:
    """Why a trace's kernels are not the plan's classes: the model family its CUDA kernels
    show, where they show one."""
    names = {op.name for ops in trace.ops.values() for op in ops if op.kind is OpKind.COMPUTE}
    for parts, family in FAMILIES:
        if any(p in n for n in names for p in parts):
            return (f"its CUDA kernels are {family}, not a transformer parasim plans; whatif "
                    "reads `parasim run` traces and Chakra ET")
    return ("a profiler trace's kernels are CUDA kernels, not classes of the plan; whatif "
            "reads `parasim run` traces and Chakra ET")


def _check_world(lt: LoadedTrace, job: dict[str, Any]) -> None:
    """A profiler trace's world and groups against `--job`'s layout."""
    layout = experiment_from_dict(job).layout
    world = lt.trace.meta.world_size
    if world is not None and world != layout.world:
        raise ConfigError(f"--job: its layout has {layout.world} ranks, but {lt.path} "
                          f"was captured on a world of {world}")
    for ops in lt.trace.ops.values():
        for op in ops:
            if op.group and max(op.group) >= layout.world:
                raise ConfigError(f"--job: its layout has {layout.world} ranks, but "
                                  f"{lt.path} has a group with rank {max(op.group)}")


def target_experiment(captured: Captured, config: str | None = None,
                      settings: Sequence[Setting] = (),
                      overrides: dict[str, Any] | None = None) -> Experiment:
    """The target: `config` (a TOML file) or the captured job, with `settings` over it."""
    if config is not None:
        data = load_config(config, settings)
        name, base = Path(config).stem, Path(config).parent
    else:
        data = apply_settings(captured.job, settings)
        name, base = "whatif", Path(".")
    with named_as_flags(settings):
        return experiment_from_dict(data, name=name, base=base, overrides=overrides)


