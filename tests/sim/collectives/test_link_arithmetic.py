"""Rings and trees routed by link arithmetic (`topology.links`) equal hop-by-hop routing:
the same flow sets, integers and floats, on fat trees of two and three tiers and on rails."""

from __future__ import annotations

import pytest

from sim.collectives import base
from sim.collectives.ring import lower_ring
from sim.collectives.tree import lower_tree
from topology.config import build_cluster
from traces.ops import OpKind

CLUSTERS = [
    {"nodes": 6, "fabric": "fat-tree", "nodes_per_leaf": 2},
    {"nodes": 9, "fabric": "fat-tree", "nodes_per_leaf": 1, "tiers": 3, "leaves_per_pod": 2},
    {"nodes": 5, "fabric": "rail"},
    {"nodes": 4, "fabric": "fat-tree", "nodes_per_leaf": 1, "nics_per_node": 2},
]
KINDS = [OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER, OpKind.BROADCAST]


def groups(n: int) -> list[tuple[int, ...]]:
    """The whole cluster, a strided (data-parallel) group, members of uneven servers."""
    return [tuple(range(n)), tuple(range(3, n, 8)), (0, 1, 2, 9, 17, 18), (5, 2, 11)]


@pytest.mark.parametrize("table", CLUSTERS)
def test_arithmetic_equals_hop_by_hop(table: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = build_cluster("dgx-h100", **table)
    fast = {(k, g, c): (lower_ring(cluster, k, g, c), lower_tree(cluster, k, g, c))
            for k in KINDS for g in groups(cluster.num_devices) for c in (None, 2)}
    assert base.link_index(cluster) is not None
    monkeypatch.setattr(base, "link_index", lambda _: None)  # route every hop by name
    slow = {(k, g, c): (lower_ring(cluster, k, g, c), lower_tree(cluster, k, g, c))
            for k in KINDS for g in groups(cluster.num_devices) for c in (None, 2)}
    assert fast == slow
    assert any(tree is not None for _, tree in fast.values())
