"""Hierarchical collectives: NVLink inside servers, one ring per NIC rail across them.

all_reduce: intra-server reduce-scatter -> inter-server all-reduce of S/k among the members
with the same position (one ring per position, each over its own NIC) -> intra-server
all-gather. reduce_scatter and all_gather keep the first two and the last two rounds.
Needs at least two servers with the same number k >= 2 of members each.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.collectives.base import (
    AG,
    AR,
    RS,
    Lowering,
    Round,
    by_server,
    cycle_latency,
    flowset,
    hop,
    uniform,
)
from topology.cluster import Cluster
from traces.ops import OpKind


def _rings(cluster: Cluster, rings: list[list[int]], factor: float, passes: int) -> Round:
    """Concurrent rings as one flow set; a chunk goes round `passes` times: 2 for an
    all-reduce, 1 for RS/AG."""
    routes, latency = [], 0.0
    for ring in rings:
        hops = [hop(cluster, ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]
        routes += hops
        latency = max(latency, passes * cycle_latency(cluster, hops))
    return ((flowset(cluster, routes, latency), factor),)


def lower_hierarchical(cluster: Cluster, kind: OpKind, group: Sequence[int],
                       channels: int | None = None) -> Lowering | None:
    servers = by_server(cluster, group)
    if kind not in (AR, RS, AG) or len(servers) < 2 or not uniform(servers) or len(servers[0]) < 2:
        return None
    k, m = len(servers[0]), len(servers)
    rails = [[s[j] for s in servers] for j in range(k)]
    intra = _rings(cluster, servers, (k - 1) / k, 1)
    if kind is AR:
        inter = _rings(cluster, rails, 2 * (m - 1) / m / k, 2)
        return (intra, inter, intra)
    inter = _rings(cluster, rails, (m - 1) / m / k, 1)
    return (intra, inter) if kind is RS else (inter, intra)
