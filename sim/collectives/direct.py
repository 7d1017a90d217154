"""Direct algorithms: all-to-all as every pair at once, one send/recv, and a neighbour exchange.

In all_to_all each rank sends S/n to every other rank (S = its whole send buffer, as
nccl-tests counts it), all flows in flight together: on a switched fabric counted per link
by class (`sim.collectives.alltoall`), elsewhere routed pair by pair.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.collectives.alltoall import all_to_all_flows, enumerated
from sim.collectives.base import A2A, Lowering, flowset, hop
from topology.cluster import Cluster
from traces.ops import OpKind


def lower_direct(cluster: Cluster, kind: OpKind, group: Sequence[int],
                 channels: int | None = None) -> Lowering | None:
    n = len(group)
    if kind is not A2A or n < 2:
        return None
    flows = all_to_all_flows(cluster, group) or enumerated(cluster, group)
    return (((flows, 1.0 / n),),)


def lower_p2p(cluster: Cluster, src: int, dst: int) -> Lowering:
    """One flow from src to dst carrying all S bytes."""
    route = hop(cluster, src, dst)
    return (((flowset(cluster, [route], cluster.path_latency(route)), 1.0),),)


def lower_sendrecv(cluster: Cluster, group: Sequence[int]) -> Lowering:
    """nccl-tests' sendrecv: every rank sends S to the next and receives S from the previous."""
    n = len(group)
    routes = [hop(cluster, group[i], group[(i + 1) % n]) for i in range(n)]
    latency = max(cluster.path_latency(r) for r in routes)
    return (((flowset(cluster, routes, latency), 1.0),),)


EXCHANGE = "exchange"
"""The name of one step of Transformer Engine's ring exchange (`lower_exchange`)."""


def lower_exchange(cluster: Cluster, group: Sequence[int]) -> Lowering:
    """One step of Transformer Engine's userbuffers ring exchange (tp_comm_overlap's
    ring_exchange method: `traces.plan.overlap`): every rank copies one shard to the next
    rank of the group and receives one from the previous, all at once, one hop of latency.
    Its size S is stated as the all-gather it replaces states it (nccl-tests' gathered
    size), of which a rank sends (n - 1) / n: its share of the bytes a ring all-gather of S
    moves, in one step instead of n - 1."""
    n = len(group)
    routes = [hop(cluster, group[i], group[(i + 1) % n]) for i in range(n)]
    latency = max(cluster.path_latency(r) for r in routes)
    return (((flowset(cluster, routes, latency), (n - 1) / n),),)
