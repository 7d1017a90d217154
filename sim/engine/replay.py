"""Replay a plan (or a measured trace) on a cluster: the discrete-event step simulation.

    times = replay(plan, cluster, ComputeModel(cluster.accelerator, profile),
                   interference=host_interference(profile), network=NetworkMode.FLOW)

Each rank's ops run on their streams (one simpy process per stream, ops in list order), waiting
for their `deps`. A collective starts when every member has issued it and stalls only the
streams that issued it; a send and its receive start together. Members absent from a partial
trace mirror the present ones (`sim.engine.lowering`). A measured op (start/end) keeps its
duration where nothing is to be simulated: compute (`sim.models.compute`), and communication
whose size the trace does not state. The parts:

  - `sim.engine.lowering.lower_communication`: the plan's communication lowered before the
    run (pure; folding, the plan's `meta.fold` (`traces.header`), is handled there);
  - `sim.engine.meetings.Meetings`: who waits for whom at run time;
  - `sim.engine.transport`: how communication is timed, one strategy per `NetworkMode` (the
    flow model `sim.engine.network`, where every transfer in flight shares the links;
    alpha-beta; free);
  - `sim.engine.occupancy`: what each rank is doing, for the interference model, and
    `sim.engine.running`: the kernels it runs, timed again when the rank starts or stops
    moving data (a kernel is slowed exactly while a transfer of its rank is in flight);
  - here: the streams, asking the cost models declared below for the time of a kernel
    (`Durations`, e.g. `sim.models.compute.ComputeModel`) and for how compute and
    communication on one rank slow each other (`sim.models.interference.Interference`; none
    by default).
`progress(done, total)`, if given, is called now and then; the command line draws the bar.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import accumulate, repeat
from operator import mul
from typing import Any, Protocol

import simpy

from sim.collectives import Algorithm
from sim.engine.host import HostCursor, HostProgram
from sim.engine.loop import Loop
from sim.engine.lowering import CommPlan, lower_communication
from sim.engine.meetings import Meetings
from sim.engine.occupancy import Occupancy
from sim.engine.running import Running
from sim.engine.steps import CONTIGUOUS, KERNEL, PLAIN, RUN, Step, rank_steps
from sim.engine.transport import NETWORK_NAMES, NetworkMode, transport_for
from sim.models.interference import NO_INTERFERENCE, Interference
from topology.cluster import Cluster
from traces.errors import ConfigError
from traces.header import check_fold_ranks
from traces.identity import Partition, recorded_fold
from traces.nogc import paused_gc
from traces.ops import COPY_STREAMS, Op, Trace

Progress = Callable[[int, int], None]
"""Called now and then with (ops finished, ops in all); the command line draws the bar."""


class Durations(Protocol):
    """What the replay asks a compute model (`sim.models.compute.ComputeModel`): an op's seconds."""

    def duration(self, op: Op) -> float: ...


@dataclass(frozen=True)
class StepTimes:
    """Start and end of every op of the plan, per rank (seconds from the step's start)."""

    plan: Trace
    starts: dict[int, list[float]]
    ends: dict[int, list[float]]
    algorithms: dict[str, int]
    """How many collectives each algorithm ran."""
    communication: Mapping[int, Mapping[int, object]] | None = None
    """Per rank, its communication ops by index (the lowering's, `CommPlan.ops`): every op
    that is not compute; None: read it from the plan."""
    fold: Partition | None = None
    """The fold by identity the plan was replayed with (`replay`'s `fold`); None: `meta.fold`'s."""

    @cached_property
    def step_time_s(self) -> float:
        return max(max(e, default=0.0) for e in self.ends.values())

    def timed_trace(self) -> Trace:
        ops = {r: tuple(replace(op, start=s, end=e) for op, s, e in
                        zip(self.plan.ops[r], self.starts[r], self.ends[r]))
               for r in self.plan.ranks}
        return Trace(ops, replace(self.plan.meta, timed=True))


def replay(plan: Trace, cluster: Cluster, compute: Durations, *,
           interference: Interference = NO_INTERFERENCE,
           network: NetworkMode = NetworkMode.FLOW, algo: Algorithm = Algorithm.AUTO,
           progress: Progress | None = None,
           gaps: Mapping[int, Sequence[float]] | None = None,
           speeds: Mapping[int, float] | None = None,
           fold: Partition | None = None,
           hosts: Mapping[int, HostProgram] | None = None) -> StepTimes:
    """Time every op of `plan` on `cluster`, kernels by `compute`, compute and communication
    on one rank slowing each other by `interference`. `gaps[rank][i]`, if given, is idle time
    op i waits once it could start (a measured trace's host time between kernel launches, see
    `host_gaps`). `speeds[rank]`, if given, stretches every kernel of the rank (per-rank
    variability, `sim.models.variability`; 1 where absent). `fold`, if given, is the plan's
    fold by identity (`traces.identity`): the plan holds its representatives, each standing
    for its class (in place of `meta.fold`'s one rank per (cp, pp)); not given, it is the
    one the plan's header records (`meta.fold_classes`, which `simulate --trace` writes), so
    a trace replays with the copies its simulation had. `hosts[rank]`, if given,
    is the rank's host thread (`sim.engine.host`): no op starts before the host launched it."""
    if network not in NETWORK_NAMES:  # a string from an untyped caller
        raise ConfigError(f"network: {network!r} is not one of {', '.join(NETWORK_NAMES)}")
    if fold is None:  # the fold its header records: a trace replays as it was simulated
        check_fold_ranks(plan.meta.folded_by, plan.ops)
        recorded = recorded_fold(plan.meta)
        fold = recorded if isinstance(recorded, Partition) else None
    else:
        assert sorted(plan.ops) == fold.representatives(), "the plan holds the fold's classes"
    # The lowering, the ~10^6 events and floats of the run and the run itself make no cycles
    # the collector need find; left on, it rescans the plan's ops again and again.
    with paused_gc():
        comm = lower_communication(plan, cluster, fold or plan.meta.fold, algo=algo)
        times = _Replay(plan, cluster, compute, interference, comm, NetworkMode(network),
                        gaps, speeds, hosts).run(progress)
    return times if fold is None else replace(times, fold=fold)


def host_gaps(trace: Trace, floor_s: float = 1e-9) -> dict[int, list[float]]:
    """Per rank and op, the idle time a timed trace shows before the op that neither its
    stream nor its dependencies explain: start − max(end of the op before it on its stream
    (the step's start for the first), ends of its dependencies). On a GPU that is the host
    launching late (Python, the framework, a CPU-bound data loader); it stays when the trace
    is replayed elsewhere. Gaps under `floor_s` (rounding) are 0; an untimed op has none."""
    gaps: dict[int, list[float]] = {}
    origin = min((op.start for ops in trace.ops.values() for op in ops if op.start is not None),
                 default=0.0)  # the step's start: where the replay starts every stream
    for rank, ops in trace.ops.items():
        last_on: dict[str, float] = {}
        out = []
        for op in ops:
            if op.start is None or op.end is None:
                out.append(0.0)
                continue
            ready = max([last_on.get(op.stream, origin),
                         *(end for d in op.deps if (end := ops[d].end) is not None)])
            gap = op.start - ready
            out.append(gap if gap > floor_s else 0.0)
            last_on[op.stream] = op.end
        gaps[rank] = out
    return gaps


class _Replay:
    """The event-driven run: one process per (rank, stream), resumed once per step
    (`sim.engine.steps`)."""

    def __init__(self, plan: Trace, cluster: Cluster, compute: Durations,
                 interference: Interference, comm: CommPlan, network: NetworkMode,
                 gaps: Mapping[int, Sequence[float]] | None = None,
                 speeds: Mapping[int, float] | None = None,
                 hosts: Mapping[int, HostProgram] | None = None) -> None:
        self.plan, self.compute, self.comm = plan, compute, comm
        self.hosts = hosts or {}
        self.cursors = {r: HostCursor(p) for r, p in self.hosts.items()}
        """Per rank with a host program, its one host thread, shared by its streams."""
        self.gaps = gaps or {}
        self.env = Loop()
        self.transport = transport_for(network, self.env, cluster, comm)
        self.occupancy = Occupancy(self.env, plan.ops, interference, self.transport, speeds)
        self.meetings = Meetings(self.env, comm)
        self.starts = {r: [float("nan")] * len(ops) for r, ops in plan.ops.items()}
        self.ends = {r: [float("nan")] * len(ops) for r, ops in plan.ops.items()}
        self.waits: dict[int, dict[int, simpy.Event]] = {r: {} for r in plan.ops}
        """Per rank, an event per op some stream waits for now (made by the first waiter, fired
        when the op ends). An op nobody waits for when it ends gets none: nobody can wait for
        it later (it is over), and an event without callbacks changes nothing in the order of
        the others."""
        self.kept: dict[int, list[bool]] = {}
        """Kernels that keep a trace's duration: it holds whatever slowed them (a measured
        run's real interference, or the stretch `simulate` gave the kernel it wrote), so the
        rank's scale never stretches them again (replaying simulate's own trace doubled the
        kernels it had stretched: 8% on the tiny example). Ranks with none: no entry."""
        if self.occupancy.slows_kernels:
            self.occupancy.running = Running(self.env, self.occupancy, plan.ops, plan.ops,
                                             self.kept)
        self.finished = 0
        self.report_at = 4096  # the next op count to call `progress` at
        self.total = plan.num_ops()
        self.progress: Progress | None = None

    def run(self, progress: Progress | None) -> StepTimes:
        self.progress = progress
        duration, plain = self.compute.duration, self.occupancy.plain
        shared: dict[tuple[float, ...], tuple[float, ...]] = {}  # runs' durations, one each
        for rank, ops in self.plan.ops.items():
            comm, calls = self.comm.ops.get(rank, {}), self.comm.calls.get(rank, array("i"))
            streams, kept = rank_steps(ops, duration, self.gaps.get(rank), comm, calls, plain,
                                       shared, self.hosts.get(rank))
            if kept is not None:
                self.kept[rank] = kept
            for steps in streams:
                self.env.start(self._stream(rank, steps))
        self.env.run()
        if progress is not None:
            progress(self.finished, self.total)
        if self.finished != self.total:
            raise ConfigError(self._stuck())
        return StepTimes(self.plan, self.starts, self.ends, dict(self.comm.algorithms),
                         self.comm.ops)

    def _stream(self, rank: int, steps: list[Step]) -> Generator[simpy.Event, Any, None]:
        """One stream of one rank: its steps in order, each after its first op's dependencies
        and host gap. The hot loop of the replay (~260,000 steps for GPT-3 on 1024 GPUs),
        hence the local names. A kernel takes its duration times the rank's `scale` when it
        starts; `kernel` and `move` give the events to wait on (`sim.engine.occupancy`)."""
        ops, starts, ends, waits = (self.plan.ops[rank], self.starts[rank], self.ends[rank],
                                    self.waits[rank])
        env, occupancy = self.env, self.occupancy
        event, timeout = env.event, env.timeout
        kernel, move, scale = occupancy.kernel(rank), occupancy.move, occupancy.scale
        transport = self.transport.move
        # where the stretch depends on the kernel, it is the kernel's while the rank moves
        # data (`busy`), times the rank's own (`base`)
        kernel_scale = occupancy.kernel_scale if occupancy.per_kernel else None
        busy, base = occupancy.busy, occupancy.base[rank]
        # where kernels notice communication, this stream's kernel step for re-timing
        slot = occupancy.running.slot(rank) if occupancy.running is not None else None
        if steps and steps[0][2].stream in COPY_STREAMS:  # host copies run on copy engines:
            kernel, scale, kernel_scale, slot = timeout, {rank: 1.0}, None, None  # no SMs
        arrive, progress = self.meetings.arrive, self.progress
        kept = self.kept.get(rank)
        cursor = self.cursors.get(rank)
        alone = (rank,)
        finished = 0  # ops this stream has finished (added to `self.finished` at its end)
        for step in steps:
            kind, i, op, deps, gap, extra, more, flag = step
            for d in deps:
                if ends[d] != ends[d]:  # NaN: not finished yet
                    done = waits.get(d)
                    if done is None:
                        done = waits[d] = event()
                    yield done
            if gap:
                yield timeout(gap)
            if cursor is not None:  # not before the host launched it
                at = cursor.launch(i)
                if at is None:
                    yield from self._host_waits(rank, cursor, i)
                    at = cursor.launch(i)
                    assert at is not None
                if at > env._now:
                    yield timeout(at - env._now)
            start = env._now  # `env.now`, without its property call
            if kind == KERNEL:
                if flag:  # its trace's duration holds its stretch already
                    yield kernel(extra)
                else:
                    if kernel_scale is None or not busy[rank]:
                        seconds = extra * scale[rank]
                    else:
                        seconds = extra * kernel_scale(op) * base
                    running = kernel(seconds)
                    if slot is not None:  # re-timed when its rank's transfers start or end
                        slot[0] = running
                        slot[1] = step
                        slot[2] = None
                        slot[3] = start
                        slot[4] = start + seconds
                    yield running
                count = 1
            elif kind == RUN:  # the ops of `extra`, back to back: the same sums as one by one
                if flag & PLAIN and (kernel_scale is None or not busy[rank]):
                    stretch = scale[rank]  # x * 1.0 == x: no product to take at 1
                    times = list(accumulate(more if stretch == 1.0 else
                                            map(mul, more, repeat(stretch)), initial=start))
                else:
                    run = range(i, i + extra) if flag & CONTIGUOUS else extra
                    times = [start]
                    if kernel_scale is None or not busy[rank]:
                        stretch = scale[rank]
                        for j, seconds in zip(run, more):
                            times.append(times[-1] + seconds * (
                                1.0 if kept and kept[j] else stretch))
                    else:
                        for j, seconds in zip(run, more):
                            times.append(times[-1] + seconds * (
                                1.0 if kept and kept[j] else kernel_scale(ops[j]) * base))
                begun = times  # each op's start: the end of the one before it
                if cursor is not None:  # each op not before its launch
                    begun, times = cursor.delay(times, range(i, i + extra)
                                                if flag & CONTIGUOUS else extra)
                running = kernel(times[-1] - start)
                if slot is not None:
                    slot[0] = running
                    slot[1] = step
                    slot[2] = times
                yield running
                # only now: others test ends[] for "done"
                if flag & CONTIGUOUS:
                    count = extra
                    starts[i:i + count - 1] = begun[:count - 1]
                    ends[i:i + count - 1] = times[1:count]
                    i += count - 1
                else:
                    count = len(extra)
                    for n, j in enumerate(extra[:-1]):
                        starts[j], ends[j] = begun[n], times[n + 1]
                    i = extra[-1]
                start = begun[count - 1]
            else:
                c = extra
                if c.need == 1:  # this rank stands for every member (fold, partial)
                    moved = transport(c.lowered, op, 1.0, 0.0) if flag else \
                        move(c.lowered, op, alone)
                    if moved is not None:
                        yield moved
                else:  # join the op's meeting; the last member to arrive runs it for all
                    meeting, last = arrive(rank, op, c, more)
                    if last:
                        moved = transport(c.lowered, op, 1.0, 0.0) if flag else \
                            move(c.lowered, op, meeting.ranks)
                        if moved is not None:
                            yield moved
                        meeting.done.succeed()
                    else:
                        yield meeting.done
                    start = meeting.start  # when every member was there
                count = 1
            starts[i] = start
            ends[i] = env._now
            if waits:
                done = waits.pop(i, None)
                if done is not None:
                    done.succeed()
            if progress is None:
                finished += count
            else:
                self.finished += count
                if self.finished >= self.report_at:
                    self.report_at += 4096
                    progress(self.finished, self.total)
        self.finished += finished

    def _host_waits(self, rank: int, cursor: HostCursor, i: int
                    ) -> Generator[simpy.Event, Any, None]:
        """Resolve the host's syncs before op i, waiting for their targets to end."""
        ends, waits = self.ends[rank], self.waits[rank]
        while cursor.launch(i) is None:
            resolved = len(cursor.bases)
            target = cursor.pending()
            if ends[target] != ends[target]:  # NaN: not finished yet
                done = waits.get(target)
                if done is None:
                    done = waits[target] = self.env.event()
                yield done
            if len(cursor.bases) == resolved:  # no other stream resolved it meanwhile
                cursor.resolve(ends[target])

    def _stuck(self) -> str:
        for rank, ops in self.plan.ops.items():
            for i, op in enumerate(ops):
                if self.ends[rank][i] != self.ends[rank][i]:
                    what = f"{op.kind} on {list(op.group)}" if op.kind.is_collective else (
                        f"{op.kind} with peer {op.peer} (tag {op.tag!r})" if op.kind.is_p2p
                        else f"compute {op.name}")
                    return (f"trace: the step cannot finish: rank {rank} op {i} ({what}, stream "
                            f"{op.stream!r}) waits for a partner or dependency that never comes")
        return "trace: the step cannot finish"
