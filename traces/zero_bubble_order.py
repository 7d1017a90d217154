"""ZB-1P's order as PyTorch's ScheduleInterleavedZeroBubble makes it
(torch/distributed/pipelining/schedules.py, `_get_1f1b_rank_ops` with enable_zero_bubble,
torch 2.13.0, git cf30153c4c131c8164ee7798e5022d810682e2cb), as plain (stage, kind,
micro-batch) steps so that `traces.pipeline` can build it without importing
`traces.zero_bubble` (which builds on its Action).

Rank r of pp with vp chunks and m micro-batches (rounds = max(1, m // pp), n = m // rounds
per round) warms up with min((vp - 1) n + pp - 1 - r, vp m) forwards; then each further
forward is followed by the next B, and from the (r + 1)-th B on each B by the W of the oldest B
not yet weighed; the last B's are followed the same way; the W's left run at the end.
Forward k runs chunk (k // n) % vp, backward k chunk vp - 1 - (k // n) % vp, each stage's
micro-batches in order.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

Kind = Literal["F", "B", "W"]
Step = tuple[int, Kind, int]
"""(virtual stage, F | B | W, micro-batch)."""


def zb1p_order(pp: int, m: int, vp: int = 1) -> dict[int, list[Step]]:
    """Per rank, its (stage, kind, micro-batch) in ZB-1P's order (the module docstring);
    m must be a multiple of max(1, m // pp)."""
    rounds = max(1, m // pp)
    assert m % rounds == 0, "zb1p needs m divisible by max(1, m // pp)"
    return {r: _zb1p_rank(r, pp, m, vp, m // rounds) for r in range(pp)}


def _zb1p_rank(r: int, pp: int, m: int, vp: int, per_round: int) -> list[Step]:
    total = vp * m
    warmup = min((vp - 1) * per_round + pp - 1 - r, total)
    counts: dict[tuple[str, int], int] = {}

    def next_of(kind: Kind, chunk: int) -> Step:
        stage = chunk * pp + r
        mb = counts.get((kind, stage), 0)
        counts[(kind, stage)] = mb + 1
        return (stage, kind, mb)

    unweighed: deque[int] = deque()  # chunks of the B's whose W has not run, oldest first
    actions = [next_of("F", (k // per_round) % vp) for k in range(warmup)]
    for k in range(total):
        if warmup + k < total:
            actions.append(next_of("F", ((warmup + k) // per_round) % vp))
        chunk = vp - 1 - (k // per_round) % vp
        actions.append(next_of("B", chunk))
        unweighed.append(chunk)
        if k >= r:
            actions.append(next_of("W", unweighed.popleft()))
    actions += [next_of("W", chunk) for chunk in unweighed]
    return actions


def zbv_order(pp: int, m: int) -> dict[int, list[Step]]:
    """Per rank, its steps in ZB-V's order as PyTorch's ScheduleZBVZeroBubble makes it (same
    file and version as above, `_calculate_single_rank_operations`): rank r runs stages
    r (chunk 0) and 2 pp - 1 - r (chunk 1). The order is made for max(2 pp - 1, m)
    micro-batches and the steps of those past m are dropped: warm-up 2(pp - r) - 1 chunk-0
    forwards, then r pairs (chunk-1 forward, chunk-0 forward), then pp - r triples (chunk-1
    F, B, W); the steady phase repeats (chunk-0 F while any are left, chunk-0 B and W,
    chunk-1 F, B and W) until both chunks' forwards are done; the cool-down runs r pairs of
    B's (chunk 0, chunk 1), pp - r pairs (chunk-0 B, its oldest W), then the chunk-1 W's
    left, then the chunk-0 W's left."""
    n = max(2 * pp - 1, m)
    out = {}
    for r in range(pp):
        stages = (r, 2 * pp - 1 - r)
        count: dict[tuple[Kind, int], int] = {}
        steps: list[Step] = []

        def run(kind: Kind, chunk: int, _stages: tuple[int, int] = stages,
                _count: dict[tuple[Kind, int], int] = count, _steps: list[Step] = steps
                ) -> None:
            mb = _count.get((kind, chunk), 0)
            _count[(kind, chunk)] = mb + 1
            _steps.append((_stages[chunk], kind, mb))

        def done(kind: Kind, chunk: int, _count: dict[tuple[Kind, int], int] = count) -> int:
            return _count.get((kind, chunk), 0)

        for _ in range(2 * (pp - r) - 1):
            run("F", 0)
        for _ in range(r):
            run("F", 1)
            run("F", 0)
        for _ in range(pp - r):
            run("F", 1)
            run("B", 1)
            run("W", 1)
        while done("F", 1) < done("F", 0) or done("F", 0) < n:
            if done("F", 0) < n:
                run("F", 0)
            for kind in ("B", "W"):
                run(kind, 0)  # type: ignore[arg-type]
            for kind in ("F", "B", "W"):
                run(kind, 1)  # type: ignore[arg-type]
        for _ in range(r):
            run("B", 0)
            run("B", 1)
        for _ in range(pp - r):
            run("B", 0)
            run("W", 0)
        while done("W", 1) < done("B", 1):
            run("W", 1)
        while done("W", 0) < done("B", 0):
            run("W", 0)
        out[r] = [step for step in steps if step[2] < m]
    return out
