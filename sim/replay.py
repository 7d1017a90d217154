"""Replay a plan (or a measured trace) on a cluster: the discrete-event step simulation.

Each rank's ops run on their streams (one simpy process per stream, ops in list order), waiting
for their `deps`. A collective starts when every member has issued it and stalls only the
streams that issued it; a send and its receive start together. Communication is lowered by
`sim.collectives` and moved by the flow model (`sim.network`), where every transfer in flight
shares the links; compute takes its roofline time (`sim.compute`).

Folding: a plan built for one representative rank per pipeline stage (`meta["folded"]`) stands
for all its tensor-parallel peers and data-parallel replicas, which run the same program. Their
traffic is not simulated separately, except where it crosses links the representatives use:
there it is added to the representatives' flow sets, so contention on shared links (a fat
tree's uplinks) is still felt. On layouts where the copies' links are disjoint from the
representatives', folded and unfolded runs give identical times.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Any

import simpy

from sim.collectives import Collectives, Lowering, analytic_time
from sim.compute import ComputeModel
from sim.network import FlowSet, Network
from topology.cluster import Cluster
from traces.errors import ConfigError
from traces.layout import Layout
from traces.ops import Op, OpKind, Trace

Progress = Callable[[int, int], None]
"""Called now and then with (ops finished, ops in all); the command line draws the bar."""

NETWORKS = ("flow", "analytic", "ideal")
"""flow: contended flow model; analytic: each transfer alone (alpha-beta); ideal: free."""


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
        return Trace(ops, {**self.plan.meta, "timed": True})


class Fold:
    """Maps the cluster's ranks onto the ranks present in a (possibly folded) plan."""

    def __init__(self, plan: Trace) -> None:
        self.present = set(plan.ops)
        self.layout: Layout | None = None
        if plan.meta.get("folded"):
            self.layout = Layout(**plan.meta["layout"])
        self._members: dict[tuple[int, ...], tuple[int, ...]] = {}

    def rank(self, rank: int) -> int:
        return self.layout.representative(rank) if self.layout else rank

    def members(self, group: tuple[int, ...]) -> tuple[int, ...]:
        """The present ranks that must issue a collective on `group`."""
        found = self._members.get(group)
        if found is None:
            found = tuple(sorted({self.rank(r) for r in group}))
            missing = [r for r in found if r not in self.present]
            if missing:
                raise ConfigError(f"trace: collective group {list(group)} includes rank "
                                  f"{missing[0]}, which has no ops in the trace")
            self._members[group] = found
        return found

    def copies(self, group: tuple[int, ...]) -> list[tuple[int, ...]]:
        return self.layout.copies(group) if self.layout else []


@dataclass(frozen=True, slots=True)
class _Comm:
    """Precomputed for one communication op: its matching channel, members, lowering."""

    channel: tuple[Any, ...]
    need: int
    lowering: Lowering


@dataclass(eq=False, slots=True)
class _Meeting:
    """A collective or a send/recv pair waiting for its members."""

    need: int
    first: Op
    done: simpy.Event
    arrived: int = 0
    start: float = 0.0


def replay(plan: Trace, cluster: Cluster, compute: ComputeModel, *, network: str = "flow",
             algo: str = "auto", progress: Progress | None = None) -> StepTimes:
    """Time every op of `plan` on `cluster`; `network` is one of NETWORKS."""
    replay = _Replay(plan, cluster, compute, network, algo)
    return replay.run(progress)


class _Replay:
    def __init__(self, plan: Trace, cluster: Cluster, compute: ComputeModel, network: str,
                 algo: str) -> None:
        self.plan, self.cluster, self.compute, self.algo = plan, cluster, compute, algo
        self.env = simpy.Environment()
        if network not in NETWORKS:
            raise ConfigError(f"network: {network!r} is not one of {', '.join(NETWORKS)}")
        self.network = network
        self.net = Network(self.env, cluster.link_capacity) if network == "flow" else None
        self.collectives = Collectives(cluster)
        self.fold = Fold(plan)
        for r in plan.ops:
            if not 0 <= r < cluster.num_devices:
                raise ConfigError(f"trace: rank {r} does not exist on {cluster.name} "
                                  f"({cluster.num_devices} accelerators)")
        self.starts = {r: [float("nan")] * len(ops) for r, ops in plan.ops.items()}
        self.ends = {r: [float("nan")] * len(ops) for r, ops in plan.ops.items()}
        self.events = {r: {d: self.env.event() for op in ops for d in op.deps}
                       for r, ops in plan.ops.items()}
        self.meetings: dict[tuple[Any, ...], _Meeting] = {}
        self.issued: dict[tuple[Any, ...], int] = {}
        self.lowered: dict[tuple[Any, ...], tuple[str, Lowering]] = {}
        self.comm: dict[int, dict[int, _Comm]] = {}
        self.algorithms: dict[str, int] = {}
        self.finished = 0
        self.progress: Progress | None = None
        self.total = 0
        self._plan_lowerings()

    # --- communication lowering, with the folded copies' traffic where it matters ------------

    def _key(self, rank: int, op: Op) -> tuple[Any, ...]:
        n = self.cluster.num_devices
        if op.kind.is_p2p:
            if not isinstance(op.peer, int) or not 0 <= op.peer < n or op.peer == rank:
                raise ConfigError(f"trace: rank {rank} {op.kind} has peer {op.peer!r}; it must "
                                  f"be another rank of the {n} on {self.cluster.name}")
            src, dst = (rank, op.peer) if op.kind is OpKind.SEND else (op.peer, rank)
            return (OpKind.SEND, (src, dst), op.size_bytes)
        if len(op.group) < 2 or not all(0 <= r < n for r in op.group) or \
                len(set(op.group)) != len(op.group):
            raise ConfigError(f"trace: rank {rank} {op.kind} on group {list(op.group)}; a group "
                              f"needs two or more distinct ranks of the {n} on "
                              f"{self.cluster.name}")
        return (op.kind, op.group, op.size_bytes)

    def _base(self, key: tuple[Any, ...]) -> tuple[str, Lowering]:
        kind, group, size = key
        if kind is OpKind.SEND:
            return "p2p", self.collectives.p2p(*group)
        return self.collectives.resolve(kind, group, size, self.algo)

    def _plan_lowerings(self) -> None:
        """Lower every distinct communication once; add the folded copies' flows on the links
        the present ranks use (the copies elsewhere mirror them and need no simulation)."""
        keys = {r: {i: self._key(r, op) for i, op in enumerate(ops)
                    if op.kind is not OpKind.COMPUTE} for r, ops in self.plan.ops.items()}
        distinct = sorted({k for per_rank in keys.values() for k in per_rank.values()}, key=repr)
        base = {key: self._base(key) for key in distinct}
        used = {link for _, lowering in base.values() for phase in lowering
                for flows, _ in phase for link in flows.links}
        for key, (algo, lowering) in base.items():
            copies = [self._copy(key, algo, g) for g in self.fold.copies(key[1])]
            self.lowered[key] = (algo, _augment(lowering, copies, used,
                                                self.cluster.link_capacity))
        comms: dict[tuple[Any, ...], _Comm] = {}  # one per distinct (key, tag, rank) value
        for rank, per_rank in keys.items():
            ops = self.plan.ops[rank]
            table = self.comm[rank] = {}
            for i, key in per_rank.items():
                op = ops[i]
                comm_key = (key, op.tag, rank if op.kind.is_collective else None)
                comm = comms.get(comm_key)
                if comm is None:
                    comm = comms[comm_key] = self._comm(rank, op, key)
                table[i] = comm
            for i, key in per_rank.items():  # count each collective once, at its first member
                op = ops[i]
                first = op.kind is OpKind.SEND or (
                    op.kind.is_collective and self.fold.members(op.group)[0] == rank)
                if first:
                    algo = self.lowered[key][0]
                    self.algorithms[algo] = self.algorithms.get(algo, 0) + 1

    def _comm(self, rank: int, op: Op, key: tuple[Any, ...]) -> _Comm:
        """Who must meet for this op, on which channel, and what it moves."""
        if op.kind.is_p2p:
            return _Comm((key[1], op.tag), 2, self.lowered[key][1])
        members = self.fold.members(op.group)
        if rank not in members:
            raise ConfigError(f"trace: rank {rank} issues {op.kind} on group "
                              f"{list(op.group)} without being in it")
        return _Comm((op.group,), len(members), self.lowered[key][1])

    def _copy(self, key: tuple[Any, ...], algo: str, group: tuple[int, ...]) -> Lowering:
        kind = key[0]
        if kind is OpKind.SEND:
            return self.collectives.p2p(*group)
        lowering = self.collectives.lowering(kind, group, algo)
        assert lowering is not None, f"{algo} applies to a group but not to its copy {group}"
        return lowering

    # --- the run ------------------------------------------------------------------------

    def run(self, progress: Progress | None) -> StepTimes:
        total = self.total = self.plan.num_ops()
        self.progress = progress
        for rank, ops in self.plan.ops.items():
            streams: dict[str, list[int]] = {}
            for i, op in enumerate(ops):
                streams.setdefault(op.stream, []).append(i)
            for indices in streams.values():
                self.env.process(self._stream(rank, indices))
        self.env.run()
        if progress is not None:
            progress(self.finished, total)
        if self.finished != total:
            raise ConfigError(self._stuck())
        return StepTimes(self.plan, self.starts, self.ends, self.algorithms)

    def _stream(self, rank: int, indices: list[int]) -> Generator[simpy.Event, Any, None]:
        ops, ends, events = self.plan.ops[rank], self.ends[rank], self.events[rank]
        comm = self.comm[rank]
        env = self.env
        for i in indices:
            op = ops[i]
            for d in op.deps:
                if ends[d] != ends[d]:  # NaN: not finished yet
                    yield events[d]
            if op.kind is OpKind.COMPUTE:
                start = env.now
                yield env.timeout(self.compute.duration(op))
            else:
                start = yield from self._communicate(rank, op, comm[i])
            self.starts[rank][i] = start
            ends[i] = env.now
            event = events.get(i)
            if event is not None:
                event.succeed()
            self.finished += 1
            if self.finished % 4096 == 0 and self.progress is not None:
                self.progress(self.finished, self.total)

    def _communicate(self, rank: int, op: Op, comm: _Comm) -> Generator[simpy.Event, Any, float]:
        """Join the op's meeting; the last member to arrive runs the transfer for all.
        Returns when the communication started (all members present)."""
        if comm.need == 1:  # a folded group: this rank stands for every member
            start = self.env.now
            yield from self._move(comm.lowering, op.size_bytes)
            return start
        count_key = (*comm.channel, op.kind if op.kind.is_p2p else None, rank)
        seq = self.issued.get(count_key, 0)
        self.issued[count_key] = seq + 1
        meeting_key = (*comm.channel, seq)
        meeting = self.meetings.get(meeting_key)
        if meeting is None:
            meeting = _Meeting(comm.need, op, self.env.event())
            self.meetings[meeting_key] = meeting
        elif (meeting.first.kind.is_p2p != op.kind.is_p2p or not op.kind.is_p2p and (
                meeting.first.kind is not op.kind or meeting.first.size_bytes != op.size_bytes)):
            raise ConfigError(f"trace: rank {rank} issues {op.kind} of {op.size_bytes:g} B as "
                              f"call #{seq} on {list(comm.channel[0])}, but another member "
                              f"issued {meeting.first.kind} of {meeting.first.size_bytes:g} B")
        meeting.arrived += 1
        if meeting.arrived < meeting.need:
            yield meeting.done
            return meeting.start
        del self.meetings[meeting_key]
        meeting.start = self.env.now
        yield from self._move(comm.lowering, op.size_bytes)
        meeting.done.succeed()
        return meeting.start

    def _move(self, lowering: Lowering, size: float) -> Generator[simpy.Event, Any, None]:
        if self.network == "ideal":
            return  # communication is free: what-if analysis and schedule tests
        if self.net is None:
            yield self.env.timeout(analytic_time(self.cluster, lowering, size))
        else:
            yield self.net.run(lowering, size)

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


def _augment(lowering: Lowering, copies: list[Lowering], used: set[int],
             capacity: tuple[float, ...]) -> Lowering:
    """Add each copy's flows that cross `used` links to the matching flow set."""
    if not copies:
        return lowering
    phases = []
    for p, phase in enumerate(lowering):
        sets = []
        for j, (flows, factor) in enumerate(phase):
            extra: dict[int, int] = {}
            for copy in copies:
                twin = copy[p][j][0]
                for link, count in zip(twin.links, twin.counts):
                    if link in used:
                        extra[link] = extra.get(link, 0) + count
            sets.append((_merge(flows, extra, capacity), factor) if extra else (flows, factor))
        phases.append(tuple(sets))
    return tuple(phases)


def _merge(flows: FlowSet, extra: dict[int, int], capacity: tuple[float, ...]) -> FlowSet:
    counts = dict(zip(flows.links, flows.counts))
    for link, count in extra.items():
        counts[link] = counts.get(link, 0) + count
    return FlowSet.from_counts(counts, flows.latency_s, capacity)
