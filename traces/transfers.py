"""A send and the receive it meets move the same bytes: the check, for loaded and built traces.

`traces.io` runs it on every file it loads; the replay's lowering (`sim.engine.lowering`) on traces
built in memory (imports).
"""

from __future__ import annotations

from collections.abc import Iterable

from traces.errors import ConfigError
from traces.ops import Op, OpKind


def check_transfer_sizes(transfers: Iterable[tuple[int, int, Op]], source: str) -> None:
    """The k-th send from a to b with a tag meets the k-th receive on b from a with that tag
    (as the replay matches them): where the trace holds both, they move the same bytes. (A
    timed op of size 0 does not state its size; the replay keeps its measured duration.)
    `transfers`: (rank, op index, op) of every send and receive, in each rank's issue order.
    Loading checks it; the replay's lowering too, for traces built in memory (imports)."""
    # (source, destination, tag) -> (op index, size) in issue order; a peer is set (checked)
    Pairs = dict[tuple[int | None, int | None, str], list[tuple[int, float]]]
    sends: Pairs = {}
    recvs: Pairs = {}
    for rank, index, op in transfers:
        if op.kind is OpKind.SEND:
            sends.setdefault((rank, op.peer, op.tag), []).append((index, _stated(op)))
        else:
            recvs.setdefault((op.peer, rank, op.tag), []).append((index, _stated(op)))
    for key, received in recvs.items():
        src, dst, tag = key
        for call, ((index, size), (sent_at, sent)) in enumerate(zip(received,
                                                                     sends.get(key, ()))):
            if size != sent and size >= 0 and sent >= 0:
                raise ConfigError(f"{source}: rank {dst}, op {index}: recv of {size:,.0f} B from "
                                  f"rank {src} (tag {tag!r}, call #{call}) meets rank {src}'s "
                                  f"op {sent_at}, a send of {sent:,.0f} B; a send and its "
                                  "receive move the same bytes")


def _stated(op: Op) -> float:
    """The op's size, or -1 where a timed op does not state it (size 0)."""
    return -1.0 if op.size_bytes == 0.0 and op.end is not None else op.size_bytes
