"""The graph builders: servers, fat trees, rails, tori, and their routing."""

from collections import Counter
from itertools import pairwise

import pytest

from topology import build_cluster
from topology.presets import PRESETS
from traces.errors import ConfigError


def kinds(cluster, route):
    return [cluster.graph.nodes[v]["kind"] for _, v in (cluster.link_ends[link] for link in route)]


def test_server_links_carry_the_data_sheet_figures(h100):
    g = h100.graph
    # NVLink4 line rate 450 GB/s per direction, of which NCCL moves 370 GB/s of data
    assert g.edges["n0.gpu0", "n0.nvswitch"]["bandwidth"] == pytest.approx(370e9)
    assert g.edges["n0.nvswitch", "n0.gpu7"]["bandwidth"] == pytest.approx(370e9)
    assert g.edges["n0.gpu3", "n0.nic3"]["kind"] == "pcie"
    a100 = build_cluster("dgx-a100", nodes=2)
    assert PRESETS["dgx-a100"].server.nvlink_Bps == 300e9  # NVLink3
    assert a100.graph.edges["n0.gpu0", "n0.nvswitch"]["bandwidth"] == pytest.approx(
        300e9 * 370 / 450)
    assert a100.graph.edges["n1.nic5", "leaf0"]["bandwidth"] == pytest.approx(25e9 * 0.96)
    assert PRESETS["dgx-h100"].server.nic_Bps == 50e9  # NDR 400 Gb/s
    assert PRESETS["dgx-a100"].accelerator.peak_flops == 312e12
    assert PRESETS["dgx-h100"].accelerator.peak_flops == pytest.approx(989.4e12)


def test_link_ids_are_dense_and_every_link_has_its_attributes(h100_rail4):
    ids = sorted(d["id"] for _, _, d in h100_rail4.graph.edges(data=True))
    assert ids == list(range(h100_rail4.graph.number_of_edges()))
    for _, _, data in h100_rail4.graph.edges(data=True):
        assert data["bandwidth"] > 0 and data["latency"] >= 0 and data["kind"]


def test_intra_server_route_crosses_the_nvswitch(h100):
    route = h100.route(0, 5)
    assert [h100.link_ends[link] for link in route] == [("n0.gpu0", "n0.nvswitch"),
                                                 ("n0.nvswitch", "n0.gpu5")]
    assert h100.route(0, 5) is route  # cached


def test_fat_tree_leaves_and_oversubscribed_uplinks():
    c = build_cluster("dgx-h100", nodes=4, nodes_per_leaf=2, oversubscription=2.0)
    leaves = [n for n, d in c.graph.nodes(data=True) if d["kind"] == "leaf"]
    spines = [n for n, d in c.graph.nodes(data=True) if d["kind"] == "spine"]
    assert len(leaves) == 2
    assert len(spines) == 8  # 16 NIC ports per leaf at 2:1 -> 8 uplinks, one per spine
    assert c.graph.out_degree("leaf0") == 16 + 8


def test_fat_tree_destination_mod_k_spreads_a_shift_without_collisions():
    c = build_cluster("dgx-h100", nodes=4, nodes_per_leaf=1)
    used = []  # every GPU sends to the same GPU of the next server: a shift permutation
    for src in range(c.num_devices):
        route = c.route(src, (src + 8) % c.num_devices)
        used += [link for link in route if c.link_ends[link][0].startswith("leaf")
                 and c.link_ends[link][1].startswith("spine")]
    assert len(used) == 32 and len(set(used)) == 32


def test_three_tier_fat_tree_routes_through_the_core():
    c = build_cluster("dgx-a100", nodes=8, nodes_per_leaf=1, tiers=3, leaves_per_pod=2)
    route = c.route(0, 7 * 8)
    assert "core" in kinds(c, route)
    near = c.route(0, 8)  # same pod: leaf -> agg -> leaf
    assert "core" not in kinds(c, near) and "spine" in kinds(c, near)


def test_rail_fabric_puts_nic_i_on_rail_i_and_crosses_rails_over_nvlink(h100_rail4):
    g = h100_rail4.graph
    for s in range(4):
        for j in range(8):
            assert g.has_edge(f"n{s}.nic{j}", f"rail{j}")
            assert not g.has_edge(f"n{s}.nic{j}", f"rail{(j + 1) % 8}")
    route = [h100_rail4.link_ends[link] for link in h100_rail4.route(0, 8 + 3)]
    assert route[0] == ("n0.gpu0", "n0.nvswitch")  # PXN: to the GPU on the destination's rail
    assert ("n0.nic3", "rail3") in route


def test_torus_links_only_between_neighbours(tpu):
    torus = tpu.fabric
    for u, v in tpu.graph.edges():
        a, b = tpu.graph.nodes[u]["coord"], tpu.graph.nodes[v]["coord"]
        diffs = [(x - y) % d for x, y, d in zip(a, b, torus.dims)]
        assert sorted(diffs) == [0, 0, 1] or sorted(diffs) == [0, 0, 3]
    assert tpu.graph.number_of_edges() == 64 * 6  # six neighbours per chip, wrap-around included


def test_torus_traffic_between_non_neighbours_crosses_intermediate_chips(tpu):
    src, dst = tpu.fabric.index((0, 0, 0)), tpu.fabric.index((2, 1, 3))
    route = tpu.route(src, dst)
    nodes = [tpu.link_ends[link][0] for link in route] + [tpu.link_ends[route[-1]][1]]
    assert len(route) == 2 + 1 + 1  # x: 2 hops, y: 1 hop, z: 1 hop the short way (3 -> wrap)
    assert nodes == ["chip0.0.0", "chip1.0.0", "chip2.0.0", "chip2.1.0", "chip2.1.3"]
    assert all(tpu.graph.nodes[n]["kind"] == "chip" for n in nodes)
    for a, b in pairwise(nodes):
        assert tpu.graph.has_edge(a, b)


def test_two_dimensional_torus_with_a_dimension_of_two():
    c = build_cluster("tpu-v4", dims=[2, 4])
    assert c.num_devices == 8
    assert c.graph.number_of_edges() == 2 * (4 * 1 + 2 * 4)  # x: 1 link per line, y: 4 per line


@pytest.mark.parametrize("ratio", [1.0, 2.0, 4.0])
def test_pod_oversubscription_thins_the_core_and_cross_pod_flows_share_it(ratio):
    """Two pods of four one-server leaves (8 NICs each: 8 uplink planes): every plane has
    4 / ratio core switches, so a shift of every GPU to the other pod (32 flows, one per NIC)
    crosses 8 x 4 / ratio aggregation-to-core links, ratio flows on each (Llama 3's cluster:
    1:7 above its pods)."""
    c = build_cluster("dgx-h100", nodes=8, nodes_per_leaf=1, tiers=3, leaves_per_pod=4,
                      pod_oversubscription=ratio)
    cores = [n for n in c.graph.nodes if n.startswith("core")]
    assert len(cores) == 8 * 4 / ratio
    used = Counter()
    for src in range(32):
        route = c.route(src, src + 32)
        used.update(link for link in route if c.link_ends[link][0].startswith("agg")
                    and c.link_ends[link][1].startswith("core"))
    assert len(used) == 8 * 4 / ratio
    assert set(used.values()) == {ratio}


def test_pod_oversubscription_needs_three_tiers():
    with pytest.raises(ConfigError, match="pod_oversubscription: 7 needs tiers = 3"):
        build_cluster("dgx-h100", nodes=8, nodes_per_leaf=1, pod_oversubscription=7)
