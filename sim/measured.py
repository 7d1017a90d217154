"""`parasim replay`: re-simulate a measured or imported trace, on its own cluster or another.

    from sim.measured import choose_cluster, load_trace, replay_trace
    loaded = load_trace("rank0.json.gz")     # a parasim trace, a profiler JSON, or a folder
    spec = choose_cluster(loaded.trace, "dgx-a100")
    result = replay_trace(loaded, spec.build())

What is kept and what is simulated (`sim.engine.replay` does the run):

* Communication is re-simulated on the cluster, except a collective or transfer whose size the
  trace does not state (`size_bytes` 0 on a timed op, as a profiler may leave it): that keeps
  its measured duration (counted in `ReplayResult.kept_measured_comm`).
* Idle time the measurement shows before an op that neither its stream nor its dependencies
  explain (the host launching late: Python, the framework) stays (`sim.engine.replay.host_gaps`):
  it does not change on another network. `host_gaps=False` drops it.
* Compute ops keep their measured durations; with `retime`, those that carry FLOPs or bytes (a
  parasim trace's) are timed by the compute model for the cluster's accelerator and the
  profile instead. A profiler's compute ops carry neither and keep their durations
  (`ReplayResult.uncosted_compute` counts them; `parasim replay --retime` says so).
* A partial trace (one rank's file of a larger job) replays by symmetry (`sim.engine.lowering`):
  group members and peers absent from the trace mirror the present ranks.

Reading: a file whose first 64 KiB hold a top-level-looking `"schema":` key is a parasim trace
(`traces.io`, which names any other schema or an unknown version), anything else a PyTorch
profiler trace (`traces.kineto`, gzip or not). A folder holding parasim traces (a `parasim
run` output) is read as their union, its other files (`chrome.json`) left out and listed;
otherwise it is a folder of per-rank profiler files. A folder of Chakra ET files
(`<name>.<rank>.et`, as `parasim export --chakra` writes), or one, is read by `traces.chakra_read`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sim.collectives import Algorithm
from sim.config import check_fp8
from sim.engine.replay import Progress, StepTimes, replay
from sim.engine.replay import host_gaps as measured_gaps
from sim.engine.transport import NETWORK_NAMES, NetworkMode
from sim.models.host import plan_compute
from sim.models.sharing import interference_for
from sim.models.stack_rates import stack_profile
from sim.models.variability import expected_speeds
from sim.profile import Profile, default_profile
from topology.cluster import Cluster
from topology.config import ClusterSpec, read_cluster, read_cluster_file, read_cluster_table
from topology.presets import PRESETS
from traces.chakra_read import ET_FILE, load_chakra
from traces.chakra_read import et_files as chakra_files
from traces.errors import ConfigError, show, warn
from traces.gzipped import head
from traces.header import TraceMeta, check_fold_ranks
from traces.identity import recorded_fold
from traces.io import load as load_parasim
from traces.kineto import dropped, load_kineto
from traces.ops import Op, OpKind, Trace

SNIFF_BYTES = 65536
_SCHEMA_KEY = re.compile(rb'"schema"\s*:')
_SUFFIXES = (".json", ".json.gz")
_CLUSTER_HINT = "give --cluster PRESET_OR_TOML [--nodes N]"


@dataclass(frozen=True, slots=True)
class LoadedTrace:
    """A trace read from TRACE, and what was read."""

    path: Path
    """TRACE as given: a file or a folder."""
    trace: Trace
    source: str
    """"parasim" (traces.io), "kineto" (a PyTorch profiler trace) or "chakra" (Chakra ET
    files, `traces.chakra_read`)."""
    files: tuple[Path, ...]
    """The files read, for the provenance hash."""
    skipped_files: tuple[str, ...] = ()
    """Files of the folder that are not parasim traces, left out beside parasim traces."""


def load_trace(path: str | Path, *, allow_incomplete: bool = False) -> LoadedTrace:
    """TRACE: a parasim trace file, a profiler JSON (.json / .json.gz), or a folder of either.
    A parasim trace of a failed run (meta.complete false) is refused unless `allow_incomplete`
    (`--allow-incomplete`): its last ops never ran, and its times stop mid-step."""
    if not str(path):
        raise ConfigError("TRACE: an empty path names no file")
    path = Path(path)
    if _is_chakra(path):
        trace, files = load_chakra(path)
        return LoadedTrace(path, _complete(path, trace, allow_incomplete), "chakra", files)
    if path.is_dir():
        return _load_folder(path, allow_incomplete)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or folder")
    if not path.is_file():
        raise ConfigError(f"{path}: not a regular file (a device, pipe or socket); parasim "
                          "reads traces only from regular files")
    if _is_parasim(path):
        return LoadedTrace(path, _complete(path, load_parasim(path), allow_incomplete),
                           "parasim", (path,))
    return _warned(LoadedTrace(path, load_kineto(path), "kineto", (path,)))


def _is_chakra(path: Path) -> bool:
    """A folder holding Chakra's `<name>.<rank>.et` files, or one of them."""
    if path.is_dir():
        return bool(chakra_files(path))
    return ET_FILE.match(path.name) is not None and path.is_file()


def _warned(loaded: LoadedTrace) -> LoadedTrace:
    """A profiler import, after one warning line counting the events it left out (and why)."""
    lost = dropped(loaded.trace.meta.skipped)
    if lost:
        reasons = ", ".join(f"{n} {why}" for why, n in lost.items())
        warn(f"{loaded.path}: left out {sum(lost.values())} events parasim cannot use: "
             f"{reasons}")
    return loaded


def _is_parasim(path: Path) -> bool:
    """Whether the file (decompressed, if gzip) announces a schema near its start (a parasim
    trace, or a parasim file of another kind, which `traces.io` then names); profiler traces
    never do."""
    try:
        start = head(path, SNIFF_BYTES)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    return _SCHEMA_KEY.search(start) is not None


def _complete(path: Path, trace: Trace, allow: bool) -> Trace:
    if trace.meta.complete is False and not allow:
        why = (trace.meta.error or "no reason recorded").splitlines()[0]
        raise ConfigError(f"{path}: a trace of a run that failed (meta.complete false: "
                          f"{show(why)}); give --allow-incomplete to read it anyway")
    return trace


def _load_folder(folder: Path, allow_incomplete: bool) -> LoadedTrace:
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(_SUFFIXES))
    ours = [p for p in files if _is_parasim(p)]
    if not ours:
        return _warned(LoadedTrace(folder, load_kineto(folder), "kineto", tuple(files)))
    ops: dict[int, tuple[Op, ...]] = {}
    seen: dict[int, Path] = {}
    meta: TraceMeta | None = None
    for path in ours:
        part = _complete(path, load_parasim(path), allow_incomplete)
        if meta is None:
            meta = part.meta
        elif (part.meta.fold, part.meta.fold_classes) != (meta.fold, meta.fold_classes):
            raise ConfigError(f"{path}: folded differently from {ours[0].name} (meta.fold); "
                              "a folder holds the files of one run")
        for rank, rank_ops in part.ops.items():
            if rank in seen:
                raise ConfigError(f"{path}: rank {rank} again (also in {seen[rank].name}); a "
                                  "folder holds each rank once")
            seen[rank] = path
            ops[rank] = rank_ops
    skipped = tuple(p.name for p in files if p not in ours)
    assert meta is not None, "a folder of parasim traces has one"
    return LoadedTrace(folder, Trace(dict(sorted(ops.items())), meta), "parasim", tuple(ours),
                       skipped)


# --- the cluster -------------------------------------------------------------------------------

def cluster_spec(name: str, overrides: dict[str, Any]) -> ClusterSpec:
    """`--cluster`: a preset or a TOML file with a [cluster] table, checked, not yet built."""
    if name in PRESETS:
        return read_cluster({"preset": name, **overrides})
    if Path(name).suffix == ".toml":
        return read_cluster_file(name, overrides)
    raise ConfigError(f"--cluster: {show(name)} is neither a preset ({', '.join(PRESETS)}) "
                      "nor a .toml file")


def choose_cluster(trace: Trace, cluster: str | None = None, *, nodes: int | None = None,
                   fabric: str | None = None) -> ClusterSpec:
    """The cluster to replay on: `cluster` (a preset or TOML file), else the one a parasim
    trace was simulated or measured on (its meta's `cluster_spec`); `nodes` and `fabric`
    override either. The trace's ranks must fit it."""
    overrides: dict[str, Any] = {k: v for k, v in (("nodes", nodes), ("fabric", fabric))
                                 if v is not None}
    if cluster is not None:
        spec = cluster_spec(cluster, overrides)
    else:
        spec = _own_cluster(trace.meta, overrides)
    check_fits(trace, spec)
    return spec


def _own_cluster(meta: TraceMeta, overrides: dict[str, Any]) -> ClusterSpec:
    if meta.cluster_spec is not None:
        return read_cluster_table(meta.cluster_spec, overrides, "trace: meta.cluster_spec")
    if meta.cluster_name is None:
        raise ConfigError(f"trace: its meta names no cluster to replay on (a profiler trace "
                          f"names none); {_CLUSTER_HINT}")
    raise ConfigError(f"trace: its cluster {show(meta.cluster_name)} is not a preset parasim "
                      f"can rebuild; {_CLUSTER_HINT}")


def check_fits(trace: Trace, spec: ClusterSpec) -> None:
    """Every rank the trace names (its own, peers, group members, a profiler's world size)
    must be an accelerator of the cluster: one line otherwise, before a graph is built."""
    top, what = -1, ""
    world = trace.meta.world_size
    if world is not None:
        top, what = world - 1, f"its world of {world} ranks"
    fold = recorded_fold(trace.meta)  # a folded plan stands for its whole world
    check_fold_ranks(trace.meta.folded_by, trace.ops)
    if fold is not None and fold.world - 1 > top:
        top, what = fold.world - 1, f"its fold's world of {fold.world} ranks"
    for rank, ops in trace.ops.items():
        for op in ops:
            named = max(rank, op.peer if op.peer is not None else -1, *op.group)
            if named > top:
                top, what = named, f"rank {named}"
    size = spec.num_devices
    if top >= size:
        name = f"{spec.preset} x{spec.nodes} {spec.fabric}"
        hint = ("a larger --cluster" if spec.fabric == "torus" else
                f"--nodes {-(-(top + 1) // spec.devices_per_server)} or a larger --cluster")
        raise ConfigError(f"trace: {what} does not fit {name} ({size} accelerators); "
                          f"give {hint}")


# --- the replay --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    """A replayed trace and what it says."""

    loaded: LoadedTrace
    cluster: Cluster
    profile: Profile
    network: NetworkMode
    algo: Algorithm
    times: StepTimes
    step_time_measured_s: float | None
    """Max end minus min start over all ops of a measured trace (a run's, a profiler's); None
    if any op is untimed, or the trace's times are a prediction (`simulate --trace`)."""
    num_ranks_mirrored: int
    """Ranks named as group members or peers but absent from the trace."""
    op_counts: dict[str, int]
    """By kind; a collective counts once however many of its members the trace holds."""
    collective_counts: dict[str, int]
    """By the name the trace gives (its kind where it gives none), counted once each."""
    collective_bytes: dict[str, float]
    """Total `size_bytes` by collective name, each collective once."""
    kept_measured_compute: int
    """Compute ops that kept their measured durations."""
    kept_measured_comm: int
    """Collectives and transfers of unstated size that kept their measured durations."""
    retimed_compute: int
    """Compute ops timed by the compute model (untimed ones, and measured ones with --retime)."""
    uncosted_compute: int = 0
    """Measured compute ops the trace states no FLOPs or bytes for (a profiler's: kineto
    records none): they keep their measured durations, with `retime` too."""
    host_gaps_s: float = 0.0
    """Idle time kept from the measurement per rank, on average (`sim.engine.replay.host_gaps`)."""
    step_time_in_trace_s: float | None = None
    """The trace's own span, measured or predicted."""
    trace_predicted: bool = False
    """The trace's times are simulate's prediction, not a measurement: it names the network
    model that timed it (`meta.network`), and no run stamped it (`meta.complete`,
    `meta.clock`)."""

    @property
    def step_time_predicted_s(self) -> float:
        return self.times.step_time_s


def replay_trace(loaded: LoadedTrace, cluster: Cluster, profile: Profile | None = None, *,
                 retime: bool = False, network: NetworkMode | None = None,
                 algo: Algorithm = Algorithm.AUTO,
                 progress: Progress | None = None, host_gaps: bool = True) -> ReplayResult:
    """Re-simulate `loaded` on `cluster` (see the module docstring); `network` defaults to the
    one a parasim trace was simulated with, else the flow model. With `host_gaps`, each op
    still waits the idle time the measurement shows before it that no dependency explains."""
    trace = loaded.trace
    if trace.num_ops() == 0:
        raise ConfigError("trace: holds no ops to replay")
    if trace.meta.model is not None:  # an fp8 plan's GEMMs need FP8 tensor cores to re-cost
        check_fp8(trace.meta.model, cluster.accelerator)
    stack_kernels = trace.meta.model.kernels if trace.meta.model is not None else "fused"
    profile = profile or stack_profile(default_profile(cluster.accelerator),
                                       cluster.accelerator, stack_kernels)
    if network is None:
        own = trace.meta.network
        network = NetworkMode(own) if isinstance(own, str) and own in NETWORK_NAMES \
            else NetworkMode.FLOW
    plan, kept, modelled, uncosted = _compute_times(trace, retime)
    gaps = measured_gaps(trace) if host_gaps else None
    # a parasim plan's model and layout state its kernels' device launches (TE's per-expert
    # quantizes too), its FP8 recipe its GEMMs' rate and its stack the experts' GEMM streams,
    # as `predict` costs them (`plan_compute`, one place)
    compute = plan_compute(cluster, profile, trace.meta.model, trace.meta.layout)
    times = replay(plan, cluster, compute,
                   interference=interference_for(cluster, profile, compute), network=network,
                   algo=algo, progress=progress, gaps=gaps,
                   speeds=_speeds(trace, cluster) if retime else None)
    ops, names, sizes, mirrored = _census(trace)
    predicted = (loaded.source in ("parasim", "chakra") and trace.meta.network is not None
                 and trace.meta.complete is None and trace.meta.clock is None)
    span = _measured_step(trace)
    return ReplayResult(
        loaded=loaded, cluster=cluster, profile=profile, network=network, algo=algo,
        times=times, step_time_measured_s=None if predicted else span,
        step_time_in_trace_s=span, trace_predicted=predicted, num_ranks_mirrored=mirrored,
        op_counts=ops, collective_counts=names, collective_bytes=sizes,
        kept_measured_compute=kept, kept_measured_comm=times.algorithms.get("measured", 0),
        retimed_compute=modelled, uncosted_compute=uncosted,
        host_gaps_s=sum(sum(g) for g in gaps.values()) / len(gaps) if gaps else 0.0)


def _speeds(trace: Trace, cluster: Cluster) -> dict[int, float] | None:
    """The cluster's variability as every rank's expected kernel stretch (None: ideal). Only
    for a retimed replay: measured kernels already ran at their rank's real speed."""
    v = cluster.variability
    if v.ideal:
        return None
    layout = trace.meta.layout
    if layout is None:
        raise ConfigError(f"cluster.jitter: {v.jitter:g}, slow_nodes: {v.slow_nodes:g}: "
                          "variability needs the trace's parallel layout, which it does not "
                          "state (an imported profile); replay it on an ideal cluster")
    return expected_speeds(v, layout, trace.ranks, cluster.devices_per_server)


def _compute_times(trace: Trace, retime: bool) -> tuple[Trace, int, int, int]:
    """The trace to replay (with `retime`, measured compute ops that carry FLOPs or bytes lose
    their times, so the compute model times them), the compute ops that keep their measured
    durations, those the model times, and the measured ones that state no FLOPs or bytes."""
    kept = modelled = uncosted = 0
    ops: dict[int, tuple[Op, ...]] = {}
    for rank, rank_ops in trace.ops.items():
        out = []
        for op in rank_ops:
            if op.kind is OpKind.COMPUTE:
                costed = bool(op.flops or op.mem_bytes or op.draws or op.gemm)
                uncosted += op.end is not None and not costed
                if op.end is not None and retime and costed:
                    op = replace(op, start=None, end=None)
                if op.end is None:
                    modelled += 1
                else:
                    kept += 1
            out.append(op)
        ops[rank] = tuple(out)
    return (Trace(ops, trace.meta) if retime else trace), kept, modelled, uncosted


def _measured_step(trace: Trace) -> float | None:
    starts = [op.start for ops in trace.ops.values() for op in ops]
    ends = [op.end for ops in trace.ops.values() for op in ops]
    if any(s is None for s in starts) or any(e is None for e in ends):
        return None
    return max(e for e in ends if e is not None) - min(s for s in starts if s is not None)


def _census(trace: Trace) -> tuple[dict[str, int], dict[str, int], dict[str, float], int]:
    """Ops by kind, collectives by name and their bytes (a collective counted at the first
    present rank its group holds, or folds onto), and how many named ranks are absent. A
    profiler's collectives go by parasim's names (all_reduce, not its "allreduce" or
    "_allgather_base"); its barriers stay "barrier"."""
    present = set(trace.ops)
    kineto = trace.meta.kineto
    fold = recorded_fold(trace.meta)
    counter: dict[tuple[int, ...], int] = {}  # group -> the present rank that counts its calls
    kinds: Counter[str] = Counter()
    names: Counter[str] = Counter()
    sizes: dict[str, float] = {}
    named: set[int] = set()
    for rank, ops in trace.ops.items():
        for op in ops:
            if op.kind.is_collective:
                named.update(op.group)
                first = counter.get(op.group)
                if first is None:
                    stand_ins = {fold.representative(r) for r in op.group} if fold else op.group
                    first = counter[op.group] = min(present.intersection(stand_ins), default=rank)
                if first != rank:
                    continue
                name = op.name or str(op.kind)
                if kineto and name != "barrier":
                    name = str(op.kind)
                names[name] += 1
                sizes[name] = sizes.get(name, 0.0) + op.size_bytes
            elif op.peer is not None:
                named.add(op.peer)
            kinds[str(op.kind)] += 1
    return (dict(sorted(kinds.items())), dict(sorted(names.items())), dict(sorted(sizes.items())),
            len(named - present))
