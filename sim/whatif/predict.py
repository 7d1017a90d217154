"""The target's step, timed by the capture: the plan built, each op given its time, replayed.

    result = whatif(captured, target_experiment(captured, settings=...))

One path for every target. A rank of the target whose ops are the capture's, op for op (the
same job, maybe on another cluster), keeps its captured ops' own times and host gaps, as
`parasim replay` keeps them: so a target equal to the captured job is `replay`, and one that
changes only the cluster is `replay --cluster`. Every other rank's compute ops take the
kernel book's times (`sim.whatif.book`: measured, fit, or profile) and its communication
is simulated on the target cluster, by link figures fitted to the capture's own
communication where the target runs on the capture's kind of cluster (`sim.whatif.links`).
Activation offload copies (`cpu_offloading_num_layers`) are no kernel: they take their bytes
over the target cluster's host link, as `simulate` times them (`sim.models.host_link`).
The range [low, high] replays the step again with every fitted or profile-timed kernel at
the low and the high end of its uncertainty; measured times stay.

The plan is built for every rank when the capture holds at least as many ranks as the target
(each can be compared with a captured one), else folded, one rank per pipeline stage
(`traces.layout.Layout.representatives`), as `simulate` folds it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from sim.config import Experiment
from sim.engine.replay import StepTimes, host_gaps, replay
from sim.models.host import plan_compute
from sim.models.sharing import interference_for
from sim.profile import Profile
from sim.simulate import fold_sound
from sim.whatif.book import KernelBook, Source, Statistic, Timing, kernel_of, learn
from sim.whatif.capture import Captured
from sim.whatif.links import LearnedLinks, learn_links
from sim.whatif.straggle import NONE, Straggle, learn_straggle, with_straggle
from topology.cluster import Cluster
from topology.config import read_cluster_table
from traces.errors import ConfigError
from traces.ops import Op, OpKind, Trace
from traces.plan import build
from traces.purpose import HostCopy


@dataclass(frozen=True, slots=True)
class KernelClass:
    """One kernel class of the target: how many of its ops came from where."""

    name: str
    sources: dict[str, int]
    ratio: float
    """The largest shape ratio among its fitted ops, as a factor >= 1 (1: none fitted)."""
    uncertainty: float

    @property
    def extrapolated(self) -> bool:
        """Some of its ops run a shape the capture never ran."""
        return any(s not in (Source.OWN, Source.MEASURED) for s in self.sources)


@dataclass(frozen=True, slots=True, kw_only=True)
class WhatifResult:
    exp: Experiment
    times: StepTimes
    low_s: float
    high_s: float
    kernels: tuple[KernelClass, ...]
    ops_by_source: dict[str, int]
    ranks_kept: int
    """Target ranks that ran op for op as captured (their own times kept)."""
    ranks: int
    captured_step_s: float | None
    captured_on: str
    """The accelerator the capture's kernels ran on: their times are its."""
    statistic: Statistic = Statistic.LOAD
    links: LearnedLinks | None = None
    """The link figures fitted to the capture's communication that timed the target's (None:
    the target cluster's own, or --profile's)."""
    time_shared: float = 1.0
    """How many times longer the target's host work (kernels, host gaps) runs than the
    capture's, its CPU ranks sharing the host's cores (`_time_shared`)."""

    straggle: Straggle = NONE
    """The capture's preemptions, whose waits at the new ranks' collectives are in their
    host gaps (`sim.whatif.straggle`; `NONE`: not a time-shared host, or not applied)."""
    straggle_s: float = 0.0
    """Those waits, summed over the rank that has the most."""

    cpu_bound_s: float = 0.0
    """`Statistic.SHARE`: the busiest new rank's CPU work over its share of a core (0: none);
    the step is no shorter."""

    communication_by_source: dict[str, int] = field(default_factory=dict)
    """Where capture links time the target: the new ranks' communication ops by where their
    time came from (`PROBED`, `FITTED`); empty otherwise."""

    @property
    def step_time_s(self) -> float:
        return max(self.times.step_time_s, self.cpu_bound_s)


def whatif(captured: Captured, exp: Experiment, fallback: Profile | None = None,
           statistic: Statistic = Statistic.LOAD, capture_links: bool | None = None,
           stragglers: bool | None = None) -> WhatifResult:
    """Predict `exp`'s step from the capture (module docstring); `statistic` sums up each
    measured shape's times (`sim.whatif.book.Statistic`); `capture_links`: time new ops'
    communication by links fitted to the capture's (`_links`); None: where the capture holds
    `parasim run`'s link probe, all-reduces at several sizes (`docs/whatif.md`);
    `stragglers`: new ranks' collectives wait for the capture's preemptions
    (`sim.whatif.straggle`); None: where both hosts' cores are time-shared and the statistic
    is a mean (`load`, `mean`)."""
    if capture_links is None:
        capture_links = any(t.meta.host_probe is not None for t in captured.traces)
    first = captured.first
    spec = first.meta.cluster_spec
    if spec is None:
        raise ConfigError("TRACE: names no cluster it ran on")
    capture_cluster = read_cluster_table(spec, where="trace: meta.cluster_spec").build()
    book = learn(captured.traces, capture_cluster, exp.model, exp.layout, fallback, statistic)
    plan = _plan(exp, captured)
    kept = _kept_ranks(plan, first)
    links = _links(captured, capture_cluster, exp, fallback, len(kept) < len(plan.ops)) \
        if capture_links else None
    cluster = links.applied_to(exp.cluster) if links is not None else exp.cluster
    gaps_of = host_gaps(first)
    shared = _time_shared(exp, capture_cluster, first)
    share = 1.0 if statistic is Statistic.SHARE else shared  # the bound times the sharing
    timed: dict[int, tuple[Op, ...]] = {}
    gaps: dict[int, list[float]] = {}
    timings: list[Timing] = []
    comm: Counter[str] = Counter()
    for rank, ops in plan.ops.items():
        if rank in kept:
            timed[rank], gaps[rank] = first.ops[rank], list(gaps_of[rank])
            continue
        out, rank_gaps = [], []
        for op in ops:
            if type(op.purpose) is HostCopy:  # no kernel: the target's host link times it
                out.append(op)
                rank_gaps.append(0.0)
            elif op.kind is OpKind.COMPUTE:
                t = book.time(op)
                timings.append(t)
                out.append(replace(op, start=0.0, end=t.seconds * share))
                rank_gaps.append(t.gap_s * share)
            else:
                op, source = _communication(op, links, exp.cluster, kept)
                comm[source] += 1
                out.append(op)
                rank_gaps.append(book.gap(op) * share)
        timed[rank], gaps[rank] = tuple(out), rank_gaps
    if stragglers is None:
        stragglers = _time_sharing(exp, capture_cluster, statistic)
    straggle = learn_straggle(captured.traces) if stragglers else NONE
    waits = 0.0
    for rank in sorted(gaps.keys() - kept) if straggle != NONE else ():
        before = sum(gaps[rank])
        gaps[rank] = with_straggle(timed[rank], gaps[rank], straggle)
        waits = max(waits, sum(gaps[rank]) - before)
    target = Trace(timed, plan.meta)
    times = _replay(exp, cluster, target, gaps)
    def bound_of(trace: Trace) -> float:
        if statistic is not Statistic.SHARE:
            return 0.0
        return _cpu_bound(trace.ops, gaps, kept, first, shared)

    bound = bound_of(target)
    low = high = max(times.step_time_s, bound)
    if any(t.uncertainty for t in timings):
        ends = [_scaled(target, kept, book, sign) for sign in (-1.0, 1.0)]
        low, high = (max(_replay(exp, cluster, t, gaps).step_time_s, bound_of(t))
                     for t in ends)
    counts = Counter(str(t.source) for t in timings)
    own = sum(op.kind is OpKind.COMPUTE for r in kept for op in timed[r])
    if own:
        counts[str(Source.OWN)] = own
    return WhatifResult(exp=exp, times=times, low_s=min(low, high), high_s=max(low, high),
                        kernels=_classes(timings, kept, timed), ops_by_source=dict(counts),
                        ranks_kept=len(kept), ranks=len(plan.ops),
                        captured_step_s=_span(first),
                        captured_on=capture_cluster.accelerator.name, statistic=statistic,
                        links=links, time_shared=shared, straggle=straggle,
                        straggle_s=waits, cpu_bound_s=bound,
                        communication_by_source=dict(comm) if links is not None else {})


PROBED = "measured (probe)"
"""A new rank's all-reduce the capture's probe ran exactly: it takes the probe's mean."""
FITTED = "fitted"
"""A new rank's communication timed by the link figures (the fit's, or the cluster's)."""


def _communication(op: Op, links: LearnedLinks | None, cluster: Cluster, kept: set[int]
                   ) -> tuple[Op, str]:
    """A new rank's communication op and where its time comes from: an all-reduce the
    capture's probe ran exactly (`sim.whatif.links.ProbeMeans.seconds`) keeps the probe's
    mean as a measured duration (unsized and timed: the lowering's measured path,
    `sim.engine.lowering`, from the moment its last member arrives, as the probe timed it);
    everything else, and a collective a kept rank (its op as captured) is a member of, is
    simulated on the links. `FITTED` only means the links time it."""
    probe = links.probe if links is not None else None
    if probe is None or not op.group or kept.intersection(op.group):
        return op, FITTED
    seconds = probe.seconds(op, cluster)
    if seconds is None:
        return op, FITTED
    return replace(op, size_bytes=0.0, start=0.0, end=seconds), PROBED


def _time_sharing(exp: Experiment, capture_cluster: Cluster, statistic: Statistic) -> bool:
    """Whether stragglers apply by default: both the capture's and the target's host state
    their cores (CPU ranks the scheduler time-slices) and the statistic is a mean (the
    median statistics leave preemption out altogether)."""
    return bool(exp.cluster.cores and capture_cluster.cores) and \
        statistic in (Statistic.LOAD, Statistic.MEAN)


def _time_shared(exp: Experiment, capture_cluster: Cluster, captured: Trace) -> float:
    """The target's time-sharing of its host's cores over the capture's (each
    `Cluster.time_shared` at the runnable threads on its first server: its ranks, and on the
    capture's host the other load the probe saw): a 4-rank target on the 2 cores a 2-rank
    capture had to itself runs each kernel twice as long. 1 where either cluster does not
    state its cores (a GPU cluster: a rank's kernels run on its own device)."""
    if not (exp.cluster.cores and capture_cluster.cores):
        return 1.0
    world = captured.meta.layout.world if captured.meta.layout else len(captured.ops)
    theirs = min(world, capture_cluster.devices_per_server)
    mine = min(exp.layout.world, exp.cluster.devices_per_server)
    other = _other_load(captured.meta.host_probe, capture_cluster.cores, theirs)
    same_host = exp.cluster.cores == capture_cluster.cores
    return (exp.cluster.time_shared(mine + (other if same_host else 0.0))
            / capture_cluster.time_shared(theirs + other))


def _cpu_bound(timed: Mapping[int, tuple[Op, ...]], gaps: Mapping[int, list[float]],
               kept: set[int], captured: Trace, shared: float) -> float:
    """The shortest step the target's CPU ranks can take: the busiest new rank's kernels
    and host gaps (unpreempted times) over the share of a core it gets, the capture's
    probed share (`executor.probe.cpu_share`; 1 unprobed) over the target's time-sharing of
    the cores relative to the capture's (`_time_shared`)."""
    probe = captured.meta.host_probe
    measured = probe.get("cpu_share") if probe else None
    share = (measured if isinstance(measured, float) and 0.0 < measured <= 1.0 else 1.0)
    work = [sum(op.end - op.start for op in timed[r] if op.kind is OpKind.COMPUTE
                and op.end is not None and op.start is not None) + sum(gaps[r])
            for r in timed if r not in kept]
    return max(work, default=0.0) * shared / share


def _other_load(probe: Mapping[str, object] | None, cores: int, ranks: int) -> float:
    """Runnable threads on the capture's host besides its `ranks`: with every rank
    computing, each got a share s < 1 of a core (`executor.probe.cpu_share`), so cores / s
    threads were runnable; 0 where each had a core (s = 1: at most `cores` were) or where
    the capture was not probed."""
    share = probe.get("cpu_share") if probe else None
    if not isinstance(share, float) or not 0.0 < share < 1.0:
        return 0.0
    return max(0.0, cores / share - ranks)


def _plan(exp: Experiment, captured: Captured) -> Trace:
    """The target's plan, whole or folded (module docstring), with the draws the captured
    run really made (none, where it ran with dropout off)."""
    held = len(captured.first.ops)
    fold = exp.layout.world > held and fold_sound(exp)
    built = build(exp.model, exp.layout, ranks=exp.layout.representatives() if fold else None)
    if captured.drew:
        return built
    return Trace({r: tuple(replace(op, draws=0.0) if op.draws else op for op in ops)
                  for r, ops in built.ops.items()}, built.meta)


def _kept_ranks(plan: Trace, captured: Trace) -> set[int]:
    """Target ranks whose ops equal the captured rank's, op for op, times aside."""
    kept = set()
    for rank, ops in plan.ops.items():
        mine = captured.ops.get(rank)
        if mine is not None and len(mine) == len(ops) and \
                all(replace(a, start=None, end=None) == b for a, b in zip(mine, ops)):
            kept.add(rank)
    return kept


def _links(captured: Captured, capture_cluster: Cluster, exp: Experiment,
           fallback: Profile | None, new_ops: bool) -> LearnedLinks | None:
    """The capture's fitted links, where they time the target's communication: some rank
    runs ops the capture did not (else the step is `replay`'s, on the cluster's figures), the
    target is on the capture's kind of cluster, no --profile gives its links, and the
    capture is a run's (a simulated step's communication is the cluster's figures already)."""
    if not new_ops or fallback is not None or captured.predicted:
        return None
    links = learn_links(captured.traces, capture_cluster)
    return links if links is not None and links.applies_to(exp.cluster) else None


def _replay(exp: Experiment, cluster: Cluster, plan: Trace, gaps: Mapping[int, list[float]]
            ) -> StepTimes:
    """`sim.measured.replay_trace`'s run, on `cluster` (the target's), the target's profile
    and network; activation offload copies (`HostCopy`) over the target's host link."""
    compute = plan_compute(cluster, exp.profile, exp.model, exp.layout)
    return replay(plan, cluster, compute,
                  interference=interference_for(cluster, exp.profile, compute),
                  network=exp.network, algo=exp.algo, gaps=gaps)


def _scaled(plan: Trace, kept: set[int], book: KernelBook, sign: float) -> Trace:
    """`plan` with every uncertain compute op's time at one end of its range."""
    ops = {}
    for rank, rank_ops in plan.ops.items():
        if rank in kept:
            ops[rank] = rank_ops
            continue
        out = []
        for op in rank_ops:
            if op.kind is OpKind.COMPUTE and op.end is not None:
                u = book.time(replace(op, start=None, end=None)).uncertainty
                op = replace(op, end=op.end * max(0.0, 1.0 + sign * u))
            out.append(op)
        ops[rank] = tuple(out)
    return Trace(ops, plan.meta)


def _classes(timings: list[Timing], kept: set[int], timed: Mapping[int, tuple[Op, ...]]
             ) -> tuple[KernelClass, ...]:
    by: dict[str, Counter[str]] = {}
    ratio: dict[str, float] = {}
    unc: dict[str, float] = {}
    for t in timings:
        by.setdefault(t.kernel, Counter())[str(t.source)] += 1
        r = max(t.ratio, 1.0 / t.ratio) if t.ratio > 0 else 1.0
        ratio[t.kernel] = max(ratio.get(t.kernel, 1.0), r)
        unc[t.kernel] = max(unc.get(t.kernel, 0.0), t.uncertainty)
    for rank in kept:
        for op in timed[rank]:
            if op.kind is OpKind.COMPUTE:
                by.setdefault(kernel_of(op), Counter())[str(Source.OWN)] += 1
    return tuple(KernelClass(n, dict(c), ratio.get(n, 1.0), unc.get(n, 0.0))
                 for n, c in sorted(by.items()))


def _span(trace: Trace) -> float | None:
    starts = [op.start for ops in trace.ops.values() for op in ops if op.start is not None]
    ends = [op.end for ops in trace.ops.values() for op in ops if op.end is not None]
    return max(ends) - min(starts) if starts and ends else None
