"""Ring algorithms, pipelined and multi-channel like NCCL's.

Channel c visits the servers in order, entering each at its c-th member, so that with 8
members per server and 8 NICs every NIC carries one ring. All hops of a ring move at once
(pipelined chunks); each flow carries its share of the bytes:

    all_reduce       2(n-1)/n * S / channels   (reduce-scatter then all-gather)
    reduce_scatter    (n-1)/n * S / channels
    all_gather        (n-1)/n * S / channels
    broadcast               S / channels       (a chain from the first member)

and the latency is that of the chunk's journey round the ring, once or twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from sim.collectives.base import (
    AG,
    AR,
    BCAST,
    RS,
    Lowering,
    by_server,
    default_channels,
    hops_flowset,
    rotated,
    uniform,
)
from topology.cluster import Cluster
from traces.ops import OpKind


def _cycle(passes: int, lats: list[list[float]]) -> float:
    """`passes` times a chunk's journey of n-1 hops: the cycle minus its fastest hop."""
    return passes * (sum(lats[0]) - min(lats[0]))


def lower_ring(cluster: Cluster, kind: OpKind, group: Sequence[int],
               channels: int | None = None) -> Lowering | None:
    if kind not in (AR, RS, AG, BCAST) or len(group) < 2:
        return None
    n = len(group)
    servers = by_server(cluster, group)
    channels = channels or default_channels(cluster, servers)
    rnd = []  # one round: every channel's ring at once
    for c in range(channels):
        order = [r for s in rotated(servers, c) for r in s] if uniform(servers) else list(group)
        if kind is BCAST:
            root = order.index(group[0])
            order = order[root:] + order[:root]
            chain = hops_flowset(cluster, [(order[:-1], order[1:], 1)],
                                 lambda lats: sum(lats[0]))
            rnd.append((chain, 1.0 / channels))
            continue
        passes = 2 if kind is AR else 1  # reduce-scatter, then all-gather
        factor = passes * (n - 1) / n / channels
        ring = hops_flowset(cluster, [(order, order[1:] + order[:1], 1)],
                            partial(_cycle, passes))
        rnd.append((ring, factor))
    return (tuple(rnd),)
