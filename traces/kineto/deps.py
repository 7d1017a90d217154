"""Dependencies between streams, inferred: kineto records times and launches, not dependencies.

The rule keeps what a replay needs and no more. Ops on one stream run in order (no edge
needed). Across streams an op X gets an edge to an op Y on another stream only for a reason
the trace shows:

1. Issue: a communication op depends on the last compute op its host thread launched before
   issuing it. PyTorch makes the communication stream wait for the current stream when a
   collective is issued, so that op produced the data the collective moves.
2. Wait, GPU traces: if X's host thread called cudaStreamWaitEvent (or a synchronize) just
   before launching X (after its previous launch, on any stream), X depends on the op on
   another stream that the thread launched last before that call (what `work.wait()` waits
   for: DDP's last gradient bucket before the optimizer, a pipeline receive before the stage).
   PyTorch waits on the stream it is about to launch on, so the wait is X's.
3. Wait, CPU traces (no wait is recorded): X depends on the communication op its host thread
   issued that ended last between the thread's previous compute op and X's launch (the thread
   sat in a synchronous collective; its next op waited for it).

Every edge agrees with the measurement: should the chosen Y end after X started, the edge goes
to the last op of Y's stream that ended before X started (or none). So every dependency ends
before its op starts, and ops that overlapped in the measurement are never ordered by a chain of
edges: a replay with the measured durations can reproduce the measured overlap, and a replay on
a slower network delays exactly what waited for the network. Ops whose launch the trace does not
link get only an issue edge, to the last op ending before them on the rank's main stream (the
stream with the most compute time).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Sequence

from traces.kineto.rank import RawOp
from traces.ops import OpKind


def in_order(ops: list[RawOp]) -> list[RawOp]:
    """The rank's op list order: by start, then end, then stream."""
    return sorted(ops, key=lambda op: (op.start, op.end, op.stream))


def main_stream(ops: Sequence[RawOp]) -> str | None:
    busy: dict[str, float] = {}
    for op in ops:
        if op.kind == OpKind.COMPUTE:
            busy[op.stream] = busy.get(op.stream, 0.0) + op.end - op.start
    return min(busy, key=lambda s: (-busy[s], s)) if busy else None


class _Streams:
    """Per-stream lookups over ops in list order."""

    def __init__(self, ops: Sequence[RawOp]) -> None:
        self.ops = ops
        self.members: dict[str, list[int]] = {}
        for index, op in enumerate(ops):
            self.members.setdefault(op.stream, []).append(index)
        self.starts = {s: [ops[i].start for i in m] for s, m in self.members.items()}

    def last_ended_by(self, stream: str, time: float) -> int | None:
        """The last op on `stream` that ended at or before `time`."""
        members = self.members.get(stream, [])
        position = bisect.bisect_right(self.starts.get(stream, []), time) - 1
        while position >= 0 and self.ops[members[position]].end > time:
            position -= 1
        return members[position] if position >= 0 else None


class _Issuers:
    """Per host thread: what it launched, in launch order, and when its ops ended."""

    def __init__(self, ops: Sequence[RawOp]) -> None:
        self.ops = ops
        self.compute: dict[Hashable, tuple[list[float], list[int]]] = {}
        self.by_stream: dict[Hashable, dict[str, tuple[list[float], list[int]]]] = {}
        self.comm_ends: dict[Hashable, tuple[list[float], list[int]]] = {}
        launched = sorted((op.launch, index) for index, op in enumerate(ops)
                          if op.issuer is not None and op.launch is not None)
        self.launched: dict[Hashable, tuple[list[float], list[int]]] = {}
        for launch, index in launched:
            op = ops[index]
            _append(self.launched.setdefault(op.issuer, ([], [])), launch, index)
            streams = self.by_stream.setdefault(op.issuer, {})
            _append(streams.setdefault(op.stream, ([], [])), launch, index)
            if op.kind == OpKind.COMPUTE:
                _append(self.compute.setdefault(op.issuer, ([], [])), launch, index)
        for end, index in sorted((op.end, index) for index, op in enumerate(ops)
                                 if op.issuer is not None and op.kind != OpKind.COMPUTE):
            _append(self.comm_ends.setdefault(ops[index].issuer, ([], [])), end, index)

    def last_compute_before(self, thread: Hashable, time: float) -> int | None:
        return _last_before(self.compute.get(thread), time)

    def last_launched_before(self, thread: Hashable, time: float, not_on: str) -> int | None:
        """The op on a stream other than `not_on` that `thread` launched last before `time`."""
        found = [_last_before(pair, time) for stream, pair in
                 self.by_stream.get(thread, {}).items() if stream != not_on]
        return max((i for i in found if i is not None), default=None,
                   key=lambda i: (self.ops[i].launch, i))

    def last_launched(self, thread: Hashable, time: float) -> int | None:
        """The op `thread` launched last before `time`, on any stream."""
        return _last_before(self.launched.get(thread), time)

    def last_comm_ended_within(self, thread: Hashable, low: float, high: float) -> int | None:
        pair = self.comm_ends.get(thread)
        if pair is None:
            return None
        position = bisect.bisect_right(pair[0], high) - 1
        return pair[1][position] if position >= 0 and pair[0][position] >= low else None


def _append(pair: tuple[list[float], list[int]], key: float, index: int) -> None:
    pair[0].append(key)
    pair[1].append(index)


def _last_before(pair: tuple[list[float], list[int]] | None, time: float) -> int | None:
    if pair is None:
        return None
    position = bisect.bisect_left(pair[0], time) - 1
    return pair[1][position] if position >= 0 else None


def dependencies(ops: Sequence[RawOp], waits: dict[Hashable, list[float]],
                 gpu: bool) -> list[tuple[int, ...]]:
    """Cross-stream dependencies of each op (indices into `ops`, which is in list order)."""
    streams, issuers = _Streams(ops), _Issuers(ops)
    main = main_stream(ops)
    out: list[tuple[int, ...]] = []
    for index, op in enumerate(ops):
        found: set[int | None] = set()
        is_comm = op.kind != OpKind.COMPUTE
        if op.issuer is not None and op.launch is not None:
            if is_comm:  # rule 1
                found.add(issuers.last_compute_before(op.issuer, op.launch))
            if gpu:  # rule 2
                found |= _waited_gpu(op, streams, issuers, waits.get(op.issuer, []))
            else:  # rule 3
                found.add(_waited_cpu(op, issuers))
        elif is_comm and main is not None:
            found.add(streams.last_ended_by(main, op.start))
        latest: dict[str, int] = {}  # per stream only the last: stream order implies the rest
        for dep in found:
            agreed = _agree(dep, index, ops, streams) if dep is not None else None
            if agreed is not None:
                stream = ops[agreed].stream
                latest[stream] = max(latest.get(stream, agreed), agreed)
        out.append(tuple(sorted(latest.values())))
    return out


def _waited_gpu(op: RawOp, streams: _Streams, issuers: _Issuers,
                waits: list[float]) -> set[int | None]:
    assert op.issuer is not None and op.launch is not None
    # The calls between the thread's previous launch and this one: a wait makes the stream of
    # the next launch wait (PyTorch waits on the stream it is about to use).
    previous = issuers.last_launched(op.issuer, op.launch)
    prior = None if previous is None else streams.ops[previous].launch
    first = bisect.bisect_right(waits, -math.inf if prior is None else prior)
    last = bisect.bisect_left(waits, op.launch)
    return {issuers.last_launched_before(op.issuer, call, op.stream)
            for call in waits[first:last]}


def _waited_cpu(op: RawOp, issuers: _Issuers) -> int | None:
    assert op.issuer is not None and op.launch is not None
    previous = issuers.last_compute_before(op.issuer, op.launch)
    low = -math.inf if previous is None else issuers.ops[previous].end
    return issuers.last_comm_ended_within(op.issuer, low, op.launch)


def _agree(dep: int, index: int, ops: Sequence[RawOp], streams: _Streams) -> int | None:
    """`dep`, or the last op of its stream that ended before op `index` started; None when it
    is on the op's own stream (stream order already holds) or nothing there ended in time."""
    op, other = ops[index], ops[dep]
    if other.stream == op.stream:
        return None
    if other.end > op.start:
        found = streams.last_ended_by(other.stream, op.start)
        if found is None:
            return None
        dep = found
    return dep if dep < index else None
