"""Measured against predicted: two timed traces of one plan, compared op by op and per step.

    result = compare(measured, predicted)      # e.g. `parasim run`'s trace and the replay's
    result.mape("fc1 fwd"), result.step_error

Both traces are read by the same rules, the simulator's notion of how long an op takes:

    compute      what it held its stream for (`occupancy`): from its start to the next op's
                 start when that one waited for nothing, else its duration plus the stream's
                 median gap — the interpreter's bookkeeping between kernels counts, as a
                 launch does on a GPU; a predicted trace has no gaps, so it is the duration
    collective   one row per call (the k-th call of the members on a stream and group): from
                 the members' latest start to their mean end (the simulator starts a
                 collective when the last member arrives and ends it for all)
    send/recv    one row per transfer: from the later of the two starts to the receive's end
    span         measured ops sharing a span id (one call that ran several plan ops, as a
                 profiler records it) are one row: the span's time against the prediction
                 from the first of its ops' start to the last one's end

Op classes are the kernel and phase ("fc1 fwd"), the collective and its plan name
("all_reduce grads"), or "send/recv". The traces must hold the same ops (the same plan);
otherwise a ConfigError names the first difference.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from traces.errors import ConfigError
from traces.ops import Op, OpKind, Trace


@dataclass(frozen=True, slots=True)
class OpError:
    """One compared row: an op, a collective call, a transfer or a span."""

    rank: int
    index: int
    """The op's index on `rank` (a collective's: its lowest member's; a span's: its first)."""
    op_class: str
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True, slots=True)
class ClassError:
    op_class: str
    count: int
    measured_s: float
    """Summed over the class's rows."""
    predicted_s: float
    mape: float
    """Mean of |predicted - measured| / measured over the rows."""
    bias: float
    """Mean of (predicted - measured) / measured: the sign says which way the model leans."""


@dataclass(frozen=True, slots=True)
class Comparison:
    rows: tuple[OpError, ...]
    classes: tuple[ClassError, ...]
    step_measured_s: float
    step_predicted_s: float

    @property
    def step_error(self) -> float:
        return (self.step_predicted_s - self.step_measured_s) / self.step_measured_s

    def mape(self, op_class: str) -> float:
        return next(c.mape for c in self.classes if c.op_class == op_class)


def compare(measured: Trace, predicted: Trace) -> Comparison:
    """Compare two timed traces of one plan (see the module docstring)."""
    _check_same_plan(measured, predicted)
    rows: list[OpError] = []
    spans = _spans(measured)
    in_span = {(r, i) for (r, _), indices in spans.items() for i in indices}
    for (rank, _), indices in sorted(spans.items()):
        ops_m, ops_p = measured.ops[rank], predicted.ops[rank]
        first = ops_m[indices[0]]
        meas = _time(first, 1) - _time(first, 0)
        pred = max(_time(ops_p[i], 1) for i in indices) - min(_time(ops_p[i], 0)
                                                              for i in indices)
        if meas > 0:
            rows.append(OpError(rank, indices[0], f"{op_class(first)} (span)", meas, pred))
    for rank in measured.ranks:
        held_m = held_times(measured.ops[rank])
        held_p = held_times(predicted.ops[rank])
        for i, meas in held_m.items():
            if (rank, i) not in in_span and meas > 0 and i in held_p:
                rows.append(OpError(rank, i, op_class(measured.ops[rank][i]), meas, held_p[i]))
    comm_p = _communication(predicted, set())
    for key, (rank, index, cls, meas) in _communication(measured, in_span).items():
        found = comm_p.get(key)
        if found is not None and meas > 0:
            rows.append(OpError(rank, index, cls, meas, found[3]))
    rows.sort(key=lambda r: (r.rank, r.index))
    return Comparison(rows=tuple(rows), classes=_classes(rows),
                      step_measured_s=step_time(measured), step_predicted_s=step_time(predicted))


def op_class(op: Op) -> str:
    if op.kind is OpKind.COMPUTE:
        return f"{op.name} {op.phase}" if op.phase is not None else op.name
    if op.kind.is_p2p:
        return "send/recv"
    return f"{op.kind} {op.name}" if op.name else str(op.kind)


def step_time(trace: Trace) -> float:
    """First start to last end over every timed op of every rank."""
    starts = [op.start for ops in trace.ops.values() for op in ops if op.start is not None]
    ends = [op.end for ops in trace.ops.values() for op in ops if op.end is not None]
    if not starts or not ends:
        raise ConfigError("compare: a trace has no timed ops")
    return max(ends) - min(starts)


def occupancy(ops: Sequence[Op], starts: Collection[int] = ()) -> list[tuple[Op, float]]:
    """Each timed compute op of one rank with what it held its stream for (see the module
    docstring); ops in a span are left out."""
    return [(ops[i], seconds) for i, seconds in held_times(ops, starts).items()]


def held_times(ops: Sequence[Op], starts: Collection[int] = ()) -> dict[int, float]:
    """`occupancy` by op index. `starts`: indices of ops that something outside the trace
    held back (a barrier before a microbenchmark's section): the op before one of them held
    its stream for its own duration and the usual gap, not until it started."""
    by_stream: dict[str, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        if _timed(op):
            by_stream[op.stream].append(i)
    out: dict[int, float] = {}
    for stream_ops in by_stream.values():
        gaps, held = [], {}
        for i, j in zip(stream_ops, stream_ops[1:]):
            a, b = ops[i], ops[j]
            if a.kind is not OpKind.COMPUTE:
                continue
            a_end, b_start = _time(a, 1), _time(b, 0)
            waited = j in starts or \
                any(ops[d].end is None or _time(ops[d], 1) > a_end for d in b.deps)
            if not waited and b_start >= a_end:
                gaps.append(b_start - a_end)
                held[i] = b_start - _time(a, 0)
        gap = statistics.median(gaps) if gaps else 0.0
        for i in stream_ops:
            if ops[i].kind is OpKind.COMPUTE:
                out[i] = held.get(i, _time(ops[i], 1) - _time(ops[i], 0) + gap)
    return out


def _timed(op: Op) -> bool:
    return op.start is not None and op.end is not None and op.span is None


def _time(op: Op, which: int) -> float:
    value = op.start if which == 0 else op.end
    assert value is not None, "a timed op"
    return value


def _check_same_plan(a: Trace, b: Trace) -> None:
    if a.ranks != b.ranks:
        raise ConfigError(f"compare: the traces hold different ranks ({a.ranks[:8]} and "
                          f"{b.ranks[:8]}); they are not of one plan")
    for rank in a.ranks:
        ops_a, ops_b = a.ops[rank], b.ops[rank]
        if len(ops_a) != len(ops_b):
            raise ConfigError(f"compare: rank {rank} holds {len(ops_a)} ops in one trace and "
                              f"{len(ops_b)} in the other; they are not of one plan")
        for i, (x, y) in enumerate(zip(ops_a, ops_b)):
            if x.kind is not y.kind or x.name != y.name or x.stream != y.stream:
                raise ConfigError(f"compare: rank {rank} op {i} is {op_class(x)} on "
                                  f"{x.stream} in one trace and {op_class(y)} on {y.stream} in "
                                  "the other; they are not of one plan")


def _spans(trace: Trace) -> dict[tuple[int, int], list[int]]:
    spans: dict[tuple[int, int], list[int]] = defaultdict(list)
    for rank in trace.ranks:
        for i, op in enumerate(trace.ops[rank]):
            if op.span is not None and op.start is not None and op.end is not None:
                spans[(rank, op.span)].append(i)
    return spans


def _communication(trace: Trace, skip: set[tuple[int, int]]
                   ) -> dict[tuple[object, ...], tuple[int, int, str, float]]:
    """Per collective call and transfer: (rank, index, class, seconds) of its row."""
    calls: dict[tuple[object, ...], list[tuple[int, int]]] = defaultdict(list)
    sends: dict[tuple[int, int, str], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int, str], list[int]] = defaultdict(list)
    for rank in trace.ranks:
        count: dict[tuple[str, tuple[int, ...]], int] = defaultdict(int)
        for i, op in enumerate(trace.ops[rank]):
            if op.kind.is_collective:
                on = (op.stream, op.group)
                calls[(*on, count[on])].append((rank, i))
                count[on] += 1
            elif op.kind is OpKind.SEND and op.peer is not None:
                sends[(rank, op.peer, op.tag)].append(i)
            elif op.kind is OpKind.RECV and op.peer is not None:
                recvs[(op.peer, rank, op.tag)].append(i)
    out: dict[tuple[object, ...], tuple[int, int, str, float]] = {}
    for key, members in calls.items():
        ops = [trace.ops[r][i] for r, i in members]
        if any(m in skip for m in members) or not all(_timed(op) for op in ops):
            continue
        start = max(_time(op, 0) for op in ops)
        end = statistics.fmean(_time(op, 1) for op in ops)
        rank, index = min(members)
        out[("call", *key)] = (rank, index, op_class(ops[0]), end - start)
    for (src, dst, tag), sent in sends.items():
        for k, (i, j) in enumerate(zip(sent, recvs.get((src, dst, tag), []))):
            send, recv = trace.ops[src][i], trace.ops[dst][j]
            if (src, i) in skip or (dst, j) in skip or not (_timed(send) and _timed(recv)):
                continue
            start = max(_time(send, 0), _time(recv, 0))
            out[("p2p", src, dst, tag, k)] = (src, i, "send/recv", _time(recv, 1) - start)
    return out


def _classes(rows: Sequence[OpError]) -> tuple[ClassError, ...]:
    by_class: dict[str, list[OpError]] = defaultdict(list)
    for row in rows:
        by_class[row.op_class].append(row)
    return tuple(ClassError(op_class=name, count=len(rs),
                            measured_s=sum(r.measured_s for r in rs),
                            predicted_s=sum(r.predicted_s for r in rs),
                            mape=statistics.fmean(abs(r.error) for r in rs),
                            bias=statistics.fmean(r.error for r in rs))
                 for name, rs in sorted(by_class.items()))
