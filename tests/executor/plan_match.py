"""A rank's recorded torch.distributed calls against its plan's communication ops."""

from __future__ import annotations

from collections import defaultdict

from executor.comm import CommCall
from traces.ops import Op


def call_sequences(calls: list[CommCall]) -> dict[tuple, list[tuple[str, int]]]:
    """Per communicator (stream, group), or per (send | recv, peer, tag) — sends match
    receives in order per direction and tag: (kind, bytes) in order."""
    out: dict[tuple, list[tuple[str, int]]] = defaultdict(list)
    for c in calls:
        key = (str(c.kind), c.peer, c.tag) if c.kind.is_p2p else (c.stream, c.group)
        out[key].append((str(c.kind), c.size_bytes))
    return dict(out)


def plan_sequences(ops: tuple[Op, ...], rank: int | None = None
                   ) -> dict[tuple, list[tuple[str, int]]]:
    """The plan's side of `call_sequences`; with `rank`, an uneven all-to-all (`Op.split`)
    counts the bytes that rank sends (its row of the byte matrix), as the call records them."""
    out: dict[tuple, list[tuple[str, int]]] = defaultdict(list)
    for op in ops:
        if op.kind.is_p2p:
            out[(str(op.kind), op.peer, op.tag)].append((str(op.kind), round(op.size_bytes)))
        elif op.kind.is_collective:
            size = op.size_bytes
            if op.split is not None and rank is not None:
                size = sum(op.split.send_splits(op.group.index(rank)))
            out[(op.stream, op.group)].append((str(op.kind), round(size)))
    return dict(out)
