"""Does a measured trace hold together? The rules every timed trace of a plan must obey.

    every op of the plan is there once, with end >= start
    ops on one stream of a rank do not overlap
    every dependency ends before its dependant starts
    the members of a collective (the k-th call on a communicator) overlap in time

`problems(trace)` lists the broken rules, one line each (empty when all hold); `tolerance_s`
absorbs clock alignment error between ranks (zero on one host, where ranks share a clock).
"""

from __future__ import annotations

from collections import defaultdict

from traces.chrome import event_name
from traces.ops import Trace


def problems(trace: Trace, tolerance_s: float = 0.0, limit: int = 20) -> list[str]:
    out: list[str] = []
    # (stream, group, k) -> (rank, start, end) of each member's k-th call on that communicator
    meetings: dict[tuple[str, tuple[int, ...], int], list[tuple[int, float, float]]] = \
        defaultdict(list)
    for rank in trace.ranks:
        ops = trace.ops[rank]
        last_end: dict[str, tuple[int, float]] = {}
        seen: dict[tuple[str, tuple[int, ...]], int] = defaultdict(int)
        for i, op in enumerate(ops):
            where = f"rank {rank} op {i} ({event_name(op)})"
            if op.start is None or op.end is None:
                out.append(f"{where}: not measured")
                continue
            if op.end < op.start:
                out.append(f"{where}: ends before it starts")
            prev = last_end.get(op.stream)
            if prev is not None and op.start < prev[1]:
                out.append(f"{where}: starts before op {prev[0]} on stream {op.stream} ends")
            last_end[op.stream] = (i, op.end)
            for dep in op.deps:
                end = ops[dep].end
                if end is not None and op.start < end:
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
