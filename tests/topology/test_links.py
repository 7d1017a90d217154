"""`LinkIndex`: link ids by arithmetic equal the graph's, every hop equal to `Cluster.route`."""

from __future__ import annotations

import numpy as np
import pytest

from sim.collectives.base import hop
from topology.config import build_cluster
from topology.links import LinkIndex

CASES = [
    {"nodes": 6, "fabric": "fat-tree", "nodes_per_leaf": 2},
    {"nodes": 5, "fabric": "fat-tree", "nodes_per_leaf": 2, "oversubscription": 2.0},
    {"nodes": 9, "fabric": "fat-tree", "nodes_per_leaf": 1, "tiers": 3, "leaves_per_pod": 2},
    {"nodes": 4, "fabric": "fat-tree", "nodes_per_leaf": 1, "tiers": 3, "leaves_per_pod": 4},
    {"nodes": 8, "fabric": "fat-tree", "nodes_per_leaf": 1, "tiers": 3, "leaves_per_pod": 4,
     "pod_oversubscription": 2.0},
    {"nodes": 3, "fabric": "fat-tree"},
    {"nodes": 4, "fabric": "rail"},
    {"nodes": 3, "fabric": "fat-tree", "nodes_per_leaf": 1, "nics_per_node": 2},
    {"nodes": 3, "fabric": "rail", "nics_per_node": 4},
    {"nodes": 3, "fabric": "fat-tree", "nodes_per_leaf": 1, "gpus_per_node": 2},
    {"nodes": 3, "fabric": "rail", "gpus_per_node": 2},
    {"nodes": 4, "fabric": "fat-tree", "nodes_per_leaf": 1, "gpus_per_node": 1,
     "nics_per_node": 1},
]


@pytest.mark.parametrize("table", CASES)
def test_every_hop_is_the_route(table: dict) -> None:
    cluster = build_cluster("dgx-h100", **table)
    index = LinkIndex.of(cluster)
    assert index is not None
    n = cluster.num_devices
    a, b = (x.ravel() for x in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    rows = index.hop_links(a, b)
    for k in range(len(a)):
        got = tuple(int(x) for x in rows[k] if x >= 0)
        assert got == hop(cluster, int(a[k]), int(b[k])), (a[k], b[k])


def test_hashed_or_adaptive_uplinks_are_not_arithmetic() -> None:
    for routing in ("ecmp", "adaptive"):
        cluster = build_cluster("dgx-h100", nodes=4, fabric="fat-tree", nodes_per_leaf=1,
                                routing=routing)
        assert LinkIndex.of(cluster) is None
