"""The kinds of op (`OpKind`): compute, the collectives and point-to-point transfers.

Its own module so that `traces.ops` (the op type) and `traces.purpose` (what an op is for) both
name kinds without importing each other.
"""

from __future__ import annotations

from enum import StrEnum


class OpKind(StrEnum):
    COMPUTE = "compute"
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    BROADCAST = "broadcast"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"
    RECV = "recv"

    @property
    def is_collective(self) -> bool:
        return self in _COLLECTIVE_SET

    @property
    def is_p2p(self) -> bool:
        return self in _P2P_SET


_P2P_SET = frozenset({OpKind.SEND, OpKind.RECV})
_COLLECTIVE_SET = frozenset(OpKind) - _P2P_SET - {OpKind.COMPUTE}
COLLECTIVES = tuple(k for k in OpKind if k.is_collective)
