"""Does a measured trace hold together? The rules every timed trace of a plan must obey.

    every op of the plan is there once (given the plan), with end >= start
    ops on one stream of a rank do not overlap
    every dependency ends before its dependant starts
    the members of a collective (the k-th call on a communicator) overlap in time

`problems(trace, plan=...)` lists the broken rules, one line each (empty when all hold);
`tolerance_s` absorbs clock alignment error between ranks (zero on one host, where ranks share
a clock). Ops sharing a `span` id (one call that ran several plan ops) are one interval: they
may share their start and end without overlapping each other.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Sequence

from traces.chrome import event_name
from traces.ops import Op, Trace

_AS_RUN = {"start", "end", "span", "draws"}
"""What a measured op adds to its plan op: its times, and the random draws it really made (a
run without dropout draws none: `executor.options.as_run`)."""
_IDENTITY = tuple(f.name for f in dataclasses.fields(Op) if f.name not in _AS_RUN)


def problems(trace: Trace, tolerance_s: float = 0.0, limit: int = 20, *,
             plan: Trace | None = None) -> list[str]:
    out: list[str] = []
    if plan is not None:
        out += _against_plan(trace, plan)
    # (stream, group, k) -> (rank, start, end) of each member's k-th call on that communicator
    meetings: dict[tuple[str, tuple[int, ...], int], list[tuple[int, float, float]]] = \
        defaultdict(list)
    for rank in trace.ranks:
        ops = trace.ops[rank]
        last: dict[str, tuple[int, float, int | None]] = {}  # stream -> (op, end, span)
        seen: dict[tuple[str, tuple[int, ...]], int] = defaultdict(int)
        for i, op in enumerate(ops):
            where = f"rank {rank} op {i} ({event_name(op)})"
            if op.start is None or op.end is None:
                out.append(f"{where}: not measured")
                continue
            if op.end < op.start:
                out.append(f"{where}: ends before it starts")
            prev = last.get(op.stream)
            if prev is not None and op.start < prev[1] and not _same_span(op, prev[2]):
                out.append(f"{where}: starts before op {prev[0]} on stream {op.stream} ends")
            last[op.stream] = (i, op.end, op.span)
            for dep in op.deps:
                if not 0 <= dep < len(ops):
                    out.append(f"{where}: depends on op {dep}, which rank {rank} lacks")
                    continue
                end = ops[dep].end
                if end is not None and op.start < end and not _same_span(op, ops[dep].span):
                    out.append(f"{where}: starts before its dependency op {dep} ends")
            if op.kind.is_collective:
                key = (op.stream, op.group)
                meetings[(op.stream, op.group, seen[key])].append((rank, op.start, op.end))
                seen[key] += 1
    for (stream, group, k), members in meetings.items():
        latest_start = max(start for _, start, _ in members)
        earliest_end = min(end for _, _, end in members)
        if latest_start > earliest_end + tolerance_s:
            ranks = [r for r, _, _ in members]
            out.append(f"collective {k} on stream {stream} group {list(group)}: members "
                       f"{ranks} do not overlap in time")
    return out[:limit]


def _same_span(op: Op, span: int | None) -> bool:
    return op.span is not None and op.span == span


def _identity(op: Op) -> tuple:
    return tuple(getattr(op, name) for name in _IDENTITY)


def _against_plan(trace: Trace, plan: Trace) -> list[str]:
    """Each rank's measured ops are its plan's, each once, in plan order."""
    out: list[str] = []
    for rank in sorted(set(plan.ranks) - set(trace.ranks)):
        out.append(f"rank {rank}: in the plan, not in the trace")
    for rank in sorted(set(trace.ranks) - set(plan.ranks)):
        out.append(f"rank {rank}: in the trace, not in the plan")
    for rank in sorted(set(plan.ranks) & set(trace.ranks)):
        out += _rank_against_plan(rank, trace.ops[rank], plan.ops[rank])
    return out


def _rank_against_plan(rank: int, measured: Sequence[Op], planned: Sequence[Op]) -> list[str]:
    want = Counter(_identity(op) for op in planned)
    got = Counter(_identity(op) for op in measured)
    out: list[str] = []
    for i, op in enumerate(planned):
        key = _identity(op)
        if got[key] < want[key]:
            out.append(f"rank {rank} plan op {i} ({event_name(op)}): missing")
            got[key] += 1  # named once
        elif got[key] > want[key]:
            out.append(f"rank {rank} plan op {i} ({event_name(op)}): there "
                       f"{got[key] - want[key] + 1} times")
            got[key] = want[key]
    for i, op in enumerate(measured):
        if _identity(op) not in want:
            out.append(f"rank {rank} op {i} ({event_name(op)}): not in the plan")
    if not out and [_identity(op) for op in measured] != [_identity(op) for op in planned]:
        out.append(f"rank {rank}: the plan's ops, out of plan order")
    return out
