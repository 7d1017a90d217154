"""Replay a plan (or a measured trace) on a cluster: the discrete-event step simulation.

    times = replay(plan, cluster, ComputeModel(cluster.accelerator, profile))

Each rank's ops run on their streams (one simpy process per stream, ops in list order), waiting
for their `deps`. A collective starts when every member has issued it and stalls only the
streams that issued it; a send and its receive start together. Members absent from a partial
trace mirror the present ones (`sim.engine.lowering`). A measured op (start/end) keeps its
duration where nothing is to be simulated: compute (`sim.models.compute`), and communication
whose size the trace does not state. The parts:

  - `sim.engine.lowering.lower_communication`: the plan's communication lowered before the
    run (pure; folding, the plan's `meta.fold` (`traces.header`), is handled there);
  - `sim.engine.meetings.Meetings`: who waits for whom at run time;
  - here: the streams, moving communication through the flow model (`sim.engine.network`,
    where every transfer in flight shares the links) and timing compute by the compute model.

A compute model may say its kernels run slower while their rank moves data
(`comm_interference`: on a CPU, gloo's threads share the cores the kernels run on); a kernel
(or a run of kernels) that starts while its rank has a transfer in flight takes (1 + it)
times as long. And the other way round (`compute_interference`): communication that starts
while one of its ranks runs a kernel first waits `compute_interference_delay_s` (for a core),
then takes (1 + it) times as long (each latency and byte).
`progress(done, total)`, if given, is called now and then; the command line draws the bar.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import simpy

from sim.collectives import analytic_time
from sim.engine.lowering import MEASURED, CommPlan, lower_communication
from sim.engine.meetings import Meetings
from sim.engine.network import Network
from topology.cluster import Cluster
from traces.errors import ConfigError
from traces.header import check_fold_ranks
from traces.nogc import paused_gc
from traces.ops import Op, OpKind, Trace

Progress = Callable[[int, int], None]
"""Called now and then with (ops finished, ops in all); the command line draws the bar."""

NETWORKS = ("flow", "analytic", "ideal")
"""flow: contended flow model; analytic: each transfer alone (alpha-beta); ideal: free."""


class Durations(Protocol):
    """What the replay needs of a compute model (`sim.models.compute.ComputeModel`)."""

    def duration(self, op: Op) -> float: ...


@dataclass(frozen=True)
class StepTimes:
    """Start and end of every op of the plan, per rank (seconds from the step's start)."""

    plan: Trace
    starts: dict[int, list[float]]
    ends: dict[int, list[float]]
    algorithms: dict[str, int]
    """How many collectives each algorithm ran."""

    @property
    def step_time_s(self) -> float:
        return max(max(e, default=0.0) for e in self.ends.values())

    def timed_trace(self) -> Trace:
        ops = {r: tuple(replace(op, start=s, end=e) for op, s, e in
                        zip(self.plan.ops[r], self.starts[r], self.ends[r]))
               for r in self.plan.ranks}
        return Trace(ops, replace(self.plan.meta, timed=True))


def replay(plan: Trace, cluster: Cluster, compute: Durations, *, network: str = "flow",
           algo: str = "auto", progress: Progress | None = None,
           gaps: Mapping[int, Sequence[float]] | None = None) -> StepTimes:
    """Time every op of `plan` on `cluster`; `network` is one of NETWORKS. `gaps[rank][i]`, if
    given, is idle time op i waits once it could start (a measured trace's host time between
    kernel launches, see `host_gaps`)."""
    if network not in NETWORKS:
        raise ConfigError(f"network: {network!r} is not one of {', '.join(NETWORKS)}")
    check_fold_ranks(plan.meta.fold, plan.ops)
    comm = lower_communication(plan, cluster, plan.meta.fold, algo=algo)
    return _Replay(plan, cluster, compute, comm, network, gaps).run(progress)


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
    """The event-driven run: one simpy process per (rank, stream)."""

    def __init__(self, plan: Trace, cluster: Cluster, compute: Durations, comm: CommPlan,
                 network: str, gaps: Mapping[int, Sequence[float]] | None = None) -> None:
        self.plan, self.cluster, self.compute, self.comm = plan, cluster, compute, comm
        self.gaps = gaps or {}
        # Kernels run (1 + interference) times longer while their rank moves data (a CPU's
        # cores are shared with gloo's threads); `busy[rank]` counts its transfers in flight.
        self.interference = float(getattr(compute, "comm_interference", 0.0))
        self.busy = dict.fromkeys(plan.ops, 0)
        # ... and data moves (1 + slow_comm) times slower while one of its ranks runs a kernel
        # (its gloo threads get the cores between the kernels' slices); `computing[rank]`.
        self.slow_comm = float(getattr(compute, "compute_interference", 0.0))
        self.comm_wait = float(getattr(compute, "compute_interference_delay_s", 0.0))
        self.computing = dict.fromkeys(plan.ops, 0)
        self.env = simpy.Environment()
        self.network = network
        self.net = Network(self.env, cluster.link_capacity) if network == "flow" else None
        net = self.net
        # A handle per lowering; -1 for measured communication, which keeps its duration.
        self.handles = [net.register(low.lowering) if low.algo != MEASURED else -1
                        for low in comm.lowered] if net else []
        self.meetings = Meetings(self.env, comm)
        self.starts = {r: [float("nan")] * len(ops) for r, ops in plan.ops.items()}
        self.ends = {r: [float("nan")] * len(ops) for r, ops in plan.ops.items()}
        self.events = {r: {d: self.env.event() for op in ops for d in op.deps}
                       for r, ops in plan.ops.items()}
        self.finished = 0
        self.report_at = 4096  # the next op count to call `progress` at
        self.total = plan.num_ops()
        self.progress: Progress | None = None

    def run(self, progress: Progress | None) -> StepTimes:
        self.progress = progress
        for rank, ops in self.plan.ops.items():
            streams: dict[str, list[int]] = {}
            for i, op in enumerate(ops):
                streams.setdefault(op.stream, []).append(i)
            for indices in streams.values():
                self.env.process(self._stream(rank, indices, self._runs(rank, indices)))
        with paused_gc():  # ~10^6 events and floats, none of them in a cycle
            self.env.run()
        if progress is not None:
            progress(self.finished, self.total)
        if self.finished != self.total:
            raise ConfigError(self._stuck())
        return StepTimes(self.plan, self.starts, self.ends, dict(self.comm.algorithms))

    def _runs(self, rank: int, indices: list[int]) -> dict[int, int]:
        """Where a stream can run several compute ops as one timeout: from op i, the number of
        ops that follow it on the stream, are compute, wait for nothing, and are not waited
        for before the last of them ends (nobody observes the instants in between)."""
        ops, waited = self.plan.ops[rank], self.events[rank]
        gaps = self.gaps.get(rank)
        runs: dict[int, int] = {}
        k = 0
        while k < len(indices):
            i = indices[k]
            j = k
            if ops[i].kind is OpKind.COMPUTE:
                while (j + 1 < len(indices) and indices[j] not in waited
                       and ops[indices[j + 1]].kind is OpKind.COMPUTE
                       and not ops[indices[j + 1]].deps
                       and not (gaps and gaps[indices[j + 1]])):
                    j += 1
            if j > k:
                runs[i] = j - k
            k = j + 1
        return runs

    def _stream(self, rank: int, indices: list[int],
                runs: dict[int, int]) -> Generator[simpy.Event, Any, None]:
        """One stream of one rank: its ops in order, each after its dependencies; a run of
        compute ops nobody else watches is one timeout. The hot loop of the replay (~1 M ops
        for GPT-3 on 1024 GPUs), hence the local names."""
        ops, starts, ends, events = (self.plan.ops[rank], self.starts[rank], self.ends[rank],
                                     self.events[rank])
        comm = self.comm.ops.get(rank, {})
        env, timeout, duration, move = self.env, self.env.timeout, self.compute.duration, self._move
        arrive, progress, compute = self.meetings.arrive, self.progress, OpKind.COMPUTE
        gaps = self.gaps.get(rank)
        busy, slower = self.busy, 1.0 + self.interference
        computing = self.computing
        k, count = 0, len(indices)
        while k < count:
            i = indices[k]
            op = ops[i]
            for d in op.deps:
                if ends[d] != ends[d]:  # NaN: not finished yet
                    yield events[d]
            if gaps and gaps[i]:
                yield timeout(gaps[i])
            start = env.now
            extra = runs.get(i)
            if extra:  # i and the next `extra` compute ops, back to back
                run = indices[k:k + extra + 1]
                times = [start]
                scale = slower if busy[rank] else 1.0
                for j in run:
                    times.append(times[-1] + duration(ops[j]) * scale)
                computing[rank] += 1
                yield timeout(times[-1] - start)
                computing[rank] -= 1
                for n, j in enumerate(run[:-1]):  # only now: others test ends[] for "done"
                    starts[j], ends[j] = times[n], times[n + 1]
                k += extra
                i = indices[k]
                self.finished += extra
                start = times[-2]
            elif op.kind is compute:
                computing[rank] += 1
                yield timeout(duration(op) * (slower if busy[rank] else 1.0))
                computing[rank] -= 1
            elif (c := comm[i]).need == 1:  # this rank stands for every member (fold, partial)
                if (moved := move(c.lowered, op, (rank,))) is not None:
                    busy[rank] += 1
                    yield moved
                    busy[rank] -= 1
            else:  # join the op's meeting; the last member to arrive runs it for all
                meeting, last = arrive(rank, op, c)
                if last:
                    if (moved := move(c.lowered, op, meeting.ranks)) is not None:
                        for member in meeting.ranks:
                            busy[member] += 1
                        yield moved
                        for member in meeting.ranks:
                            busy[member] -= 1
                    meeting.done.succeed()
                else:
                    yield meeting.done
                start = meeting.start  # when every member was there
            starts[i] = start
            ends[i] = env.now
            event = events.get(i)
            if event is not None:
                event.succeed()
            self.finished += 1
            k += 1
            if progress is not None and self.finished >= self.report_at:
                self.report_at += 4096
                progress(self.finished, self.total)

    def _move(self, lowered: int, op: Op, ranks: Sequence[int]) -> simpy.Event | None:
        """An event that fires when the communication of `op` (the last of `ranks` to arrive)
        has moved its bytes — after a wait of compute_interference_delay_s and every latency
        and byte (1 + compute_interference) times over if one of `ranks` is running a kernel —
        or taken its measured duration if the trace does not size it; None when communication
        is free (the ideal network: what-if analysis and schedule tests)."""
        stretch, wait = 1.0, 0.0
        if (self.slow_comm or self.comm_wait) and any(self.computing[r] for r in ranks):
            stretch, wait = 1.0 + self.slow_comm, self.comm_wait
        if self.net is not None and (handle := self.handles[lowered]) >= 0:
            if wait:
                return self.env.process(self._after(wait, handle, op.size_bytes, stretch))
            return self.net.run(handle, op.size_bytes, stretch)
        if self.network == "ideal":
            return None
        low = self.comm.lowered[lowered]
        if low.algo == MEASURED:
            assert op.start is not None and op.end is not None, "measured ops are timed"
            return self.env.timeout(op.end - op.start)
        return self.env.timeout(
            wait + analytic_time(self.cluster, low.lowering, op.size_bytes) * stretch)

    def _after(self, wait: float, handle: int, size_bytes: float,
               stretch: float) -> Generator[simpy.Event, Any, None]:
        """Communication on the flow network that starts `wait` seconds from now."""
        yield self.env.timeout(wait)
        assert self.net is not None
        yield self.net.run(handle, size_bytes, stretch)

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
