"""Recursive halving and doubling: log2(n) lock-step rounds of pairwise exchanges.

Reduce-scatter halves the data each round while the partner distance halves (n/2, n/4, ... 1);
all-gather runs the rounds in reverse; all-reduce is the two (Rabenseifner). Broadcast is the
binomial tree: in round r the 2^r ranks that have the data send all of it to a rank 2^r away.
Needs a power-of-two group.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.collectives.base import AG, AR, BCAST, RS, Lowering, Round, flowset, hop
from topology.cluster import Cluster
from traces.ops import OpKind


def _round(cluster: Cluster, pairs: list[tuple[int, int]], factor: float) -> Round:
    routes = [hop(cluster, a, b) for a, b in pairs]
    latency = max(cluster.path_latency(r) for r in routes)
    return ((flowset(cluster, routes, latency), factor),)


def lower_rhd(cluster: Cluster, kind: OpKind, group: Sequence[int],
              channels: int | None = None) -> Lowering | None:
    n = len(group)
    if kind not in (AR, RS, AG, BCAST) or n < 2 or n & (n - 1):
        return None
    num_rounds = n.bit_length() - 1
    if kind is BCAST:
        return tuple(
            _round(cluster, [(group[i], group[i + (1 << r)]) for i in range(1 << r)], 1.0)
            for r in range(num_rounds)
        )
    halving = []  # distance n/2 first; each rank exchanges half of what it still holds
    for r in range(num_rounds):
        distance = n >> (r + 1)
        pairs = [(group[i], group[i ^ distance]) for i in range(n)]
        halving.append(_round(cluster, pairs, 1.0 / (2 << r)))
    doubling = halving[::-1]
    if kind is RS:
        return tuple(halving)
    if kind is AG:
        return tuple(doubling)
    return tuple(halving + doubling)
