"""All-to-all counted by class equals all-to-all routed pair by pair, on every switched fabric."""

from __future__ import annotations

import pytest

from sim.collectives.alltoall import all_to_all_flows, enumerated
from sim.collectives.direct import lower_direct
from topology.config import build_cluster
from traces.errors import ConfigError
from traces.ops import OpKind

FABRICS = [
    ("dgx-h100", 1, {}),
    ("dgx-h100", 12, {}),
    ("dgx-h100", 12, {"fabric": "rail"}),
    ("dgx-a100", 6, {}),
    ("dgx-h100", 24, {"tiers": 3, "leaves_per_pod": 2}),
    ("dgx-h100", 20, {"tiers": 3, "leaves_per_pod": 2, "oversubscription": 2.0}),
    ("dgx-h100", 10, {"nodes_per_leaf": 3, "nics_per_node": 4}),
    ("dgx-h100", 10, {"nodes_per_leaf": 2, "nics_per_node": 2, "tiers": 3,
                      "leaves_per_pod": 2}),
]


def _groups(n: int, g: int) -> list[list[int]]:
    """Whole servers, three GPUs of each, one GPU of two servers in three, servers 1 and 2,
    and the same in a shuffled communicator order."""
    groups = [list(range(n)), [r for r in range(n) if r % g in (1, 3, 6)],
              [r for r in range(n) if r % g == 5 and r // g % 3 != 1], list(range(g, 3 * g)),
              [r for r in range(n) if r % g in (0, 7)][::-1]]
    return [grp for grp in groups if len(grp) >= 2 and max(grp) < n]


@pytest.mark.parametrize(("preset", "nodes", "table"), FABRICS)
def test_counted_by_class_is_routed_pair_by_pair(preset: str, nodes: int,
                                                 table: dict[str, object]) -> None:
    cluster = build_cluster(preset, nodes=nodes, **table)
    for group in _groups(cluster.num_devices, cluster.devices_per_server):
        counted = all_to_all_flows(cluster, group)
        assert counted is not None
        assert counted == enumerated(cluster, group)  # the same links, counts, latency, rate


def test_never_above_what_the_links_carry() -> None:
    cluster = build_cluster("dgx-h100", nodes=24, tiers=3, leaves_per_pod=2)
    lowering = lower_direct(cluster, OpKind.ALL_TO_ALL, tuple(range(cluster.num_devices)))
    assert lowering is not None
    ((flows, factor),), = lowering
    assert factor == 1 / cluster.num_devices
    loads = [n * flows.solo_rate / cluster.link_capacity[link]
             for link, n in zip(flows.links, flows.counts)]
    assert max(loads) == pytest.approx(1.0, rel=1e-12)  # the bottleneck link full, none over


def test_uneven_groups_are_routed_pair_by_pair() -> None:
    cluster = build_cluster("dgx-h100", nodes=4)
    uneven = [0, 1, 2, 8, 9, 17]  # three GPUs of one server, two of another, one of a third
    assert all_to_all_flows(cluster, uneven) is None
    lowering = lower_direct(cluster, OpKind.ALL_TO_ALL, tuple(uneven))
    assert lowering is not None and lowering[0][0][0] == enumerated(cluster, uneven)


def test_a_torus_is_routed_pair_by_pair() -> None:
    cluster = build_cluster("tpu-v4", nodes=16)
    assert all_to_all_flows(cluster, list(range(8))) is None


def test_routing_pair_by_pair_is_bounded() -> None:
    cluster = build_cluster("dgx-h100", nodes=129)
    uneven = tuple(range(1026))  # 128 whole servers and two GPUs of the 129th
    with pytest.raises(ConfigError, match=r"1,026 ranks make 1,051,650 flows .* 1,048,576"):
        lower_direct(cluster, OpKind.ALL_TO_ALL, uneven)
