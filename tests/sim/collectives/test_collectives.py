"""Collective algorithms against closed forms, physical bounds and each other."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.collectives import Collectives, analytic_time
from sim.collectives.base import busbw_factor
from sim.collectives.tree import tree_edges
from tests.conftest import timed
from topology import build_cluster
from traces.ops import OpKind

AR, RS, AG = OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER
GiB = 2**30


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("size", [1024, 2**20, GiB])
def test_ring_on_one_nvswitch_node_matches_the_closed_form(h100, n, size):
    group = tuple(range(n))
    bandwidth = h100.link_capacity[h100.route(0, 1)[0]]  # NVLink's data rate per direction
    alpha = 2 * h100.link_latency[h100.route(0, 1)[0]]  # GPU -> NVSwitch -> GPU
    ar = timed(h100, AR, group, size, "ring")
    assert ar == pytest.approx(2 * (n - 1) / n * size / bandwidth + 2 * (n - 1) * alpha, rel=1e-9)
    for kind in (RS, AG):
        t = timed(h100, kind, group, size, "ring")
        assert t == pytest.approx((n - 1) / n * size / bandwidth + (n - 1) * alpha, rel=1e-9)
    # The seeds' identity: all-reduce = reduce-scatter + all-gather.
    rs, ag = timed(h100, RS, group, size, "ring"), timed(h100, AG, group, size, "ring")
    assert ar == pytest.approx(rs + ag, rel=1e-9)


def test_ring_busbw_tends_to_the_nvlink_bandwidth(h100):
    group = tuple(range(8))
    busbw = [busbw_factor(AR, 8) * s / timed(h100, AR, group, s, "ring")
             for s in (2**20, 2**24, 2**28, 2**33)]
    assert busbw == sorted(busbw)
    nvlink = h100.link_capacity[h100.route(0, 1)[0]]
    assert busbw[-1] == pytest.approx(nvlink, rel=1e-3)
    assert busbw[-1] <= nvlink


def test_two_to_one_oversubscription_halves_cross_leaf_not_intra_leaf_bandwidth():
    def busbw(nodes_per_leaf, ratio):  # DGX A100: rings are NIC-bound, not NVLink-bound
        c = build_cluster("dgx-a100", nodes=2, nodes_per_leaf=nodes_per_leaf,
                          oversubscription=ratio)
        return busbw_factor(AR, 16) * GiB / timed(c, AR, tuple(range(16)), GiB, "ring")

    cross = busbw(1, 2.0) / busbw(1, 1.0)  # one server per leaf: the ring crosses the spine
    assert cross == pytest.approx(0.5, rel=0.02)
    assert busbw(2, 2.0) == busbw(2, 1.0)  # both servers under one leaf: no uplink in the path


def test_across_nodes_multi_channel_and_hierarchical_are_nic_bound_and_beat_one_ring():
    c = build_cluster("dgx-a100", nodes=4, fabric="rail")
    nic = c.graph.edges["n0.nic0", "rail0"]["bandwidth"]
    fast_nvlink = build_cluster("dgx-a100", nodes=4, fabric="rail", nvlink_bandwidth="600GB/s")
    group = tuple(range(32))
    single = timed(c, AR, group, GiB, "ring", channels=1)
    factor = busbw_factor(AR, 32)
    assert factor * GiB / single <= nic  # one ring: one NIC's worth
    for algo in ("ring", "hierarchical"):
        t = timed(c, AR, group, GiB, algo)
        assert factor * GiB / t <= 8 * nic * (1 + 1e-9)  # never above the 8 NICs
        assert t < single / 3
    ring = timed(c, AR, group, GiB, "ring")
    assert factor * GiB / ring == pytest.approx(8 * nic, rel=0.01)
    assert timed(fast_nvlink, AR, group, GiB, "ring") == pytest.approx(ring, rel=1e-3)


def test_per_dimension_rings_beat_one_flat_ring_on_a_torus(tpu):
    group = tuple(range(64))
    torus = timed(tpu, AR, group, GiB, "torus")
    flat = timed(tpu, AR, group, GiB, "ring")
    assert torus < flat / 3
    # Full lines along every axis: every flow of the torus algorithm is a single neighbour hop.
    for rnd in Collectives(tpu).lowering(AR, group, "torus"):
        for flows, _ in rnd:
            assert sum(flows.counts) == 2 * 64  # one hop per member, in both directions


def test_torus_time_matches_its_closed_form(tpu):
    # 3 chunks of S/3, each RS/AG over three axes of 4 chips in both directions:
    # bytes per flow sum to 2 * 3/4 * (S/3)/2 * (1 + 1/4 + 1/16).
    size = GiB
    per_flow = 2 * 0.75 * size / 6 * (1 + 1 / 4 + 1 / 16)
    latency = 2 * 3 * 3 * 1e-6  # six rounds of 3 neighbour hops
    assert timed(tpu, AR, tuple(range(64)), size, "torus") == pytest.approx(
        per_flow / 50e9 + latency, rel=1e-9)


def test_double_binary_tree_makes_each_server_interior_in_at_most_one_tree():
    for n in (2, 4, 8, 16, 32):
        interior = [{p for p, _ in tree_edges(n, mirror)} for mirror in (False, True)]
        assert not interior[0] & interior[1]
        for mirror in (False, True):
            children = [p for p, _ in tree_edges(n, mirror)]
            assert max(children.count(p) for p in set(children)) <= 2
            assert len(tree_edges(n, mirror)) == n - 1


def test_auto_picks_the_fastest_applicable_algorithm_on_a_torus():
    torus = build_cluster("tpu-v4", dims=[4, 4])
    col = Collectives(torus)
    group = tuple(range(16))
    for size in (1024, 2**20, GiB):
        algo, lowering = col.resolve(AR, group, size)
        times = {a: analytic_time(torus, col.lowering(AR, group, a), size)
                 for a in col.applicable(AR, group)}
        assert times[algo] == min(times.values())


def test_auto_picks_what_nccl_would_on_gpu_clusters(h100_rail4):
    """On NVSwitch/InfiniBand clusters `auto` is NCCL's choice
    (tests/sim/collectives/test_nccl.py)."""
    col = Collectives(h100_rail4)
    group = tuple(range(32))
    for size in (1024, 2**20, GiB):
        algo, _ = col.resolve(AR, group, size)
        assert algo == col.nccl(AR, group, size)[0]  # type: ignore[index]
        assert col.lowering(AR, group, algo) is not None  # its flows, for folded copies


CLUSTERS = {
    "h100x1": build_cluster("dgx-h100", nodes=1),
    "h100x2-rail": build_cluster("dgx-h100", nodes=2, fabric="rail"),
    "a100x4-fat-tree-2to1": build_cluster("dgx-a100", nodes=4, nodes_per_leaf=1,
                                          oversubscription=2.0),
    "tpu-4x4": build_cluster("tpu-v4", dims=[4, 4]),
    "tpu-4x4x4": build_cluster("tpu-v4"),
}


COLLECTIVES = {name: Collectives(cluster) for name, cluster in CLUSTERS.items()}
STRIDES = (1, 2, 4, 8)


@st.composite
def uncontended_cases(draw):
    """(cluster name, kind, group, algorithm, size) with an algorithm that applies: a group of
    2 to 64 members taken at a stride, the algorithm one of those that can run it."""
    name = draw(st.sampled_from(sorted(CLUSTERS)))
    n = CLUSTERS[name].num_devices
    stride = draw(st.sampled_from([s for s in STRIDES if n // s >= 2]))
    group = tuple(range(0, n, stride))[:draw(st.integers(2, min(64, n // stride)))]
    kind = draw(st.sampled_from([AR, RS, AG, OpKind.BROADCAST, OpKind.ALL_TO_ALL]))
    algo = draw(st.sampled_from(COLLECTIVES[name].applicable(kind, group)))
    return name, kind, group, algo, draw(st.integers(1, 2**32))


@settings(max_examples=100, deadline=None)
@given(uncontended_cases())
def test_flow_model_equals_analytic_path_when_uncontended(case):
    name, kind, group, algo, size = case
    cluster = CLUSTERS[name]
    lowering = COLLECTIVES[name].lowering(kind, group, algo)
    flow = timed(cluster, kind, group, size, algo)
    assert flow == pytest.approx(analytic_time(cluster, lowering, size), rel=1e-9)


def test_parasim_collective_prints_nccls_algorithm_and_protocol_per_size(capsys):
    """`parasim collective` names what NCCL would run at each size, as NCCL_DEBUG=INFO does:
    on a DGX A100 ring/LL at 1 KiB, ring/LL128 at 8 MiB, ring/Simple at 8 GiB."""
    from sim.cli import main

    code = main(["collective", "--cluster", "dgx-a100", "--nodes", "1", "--op", "all_reduce",
                 "--sizes", "1K,8M,8G", "--model", "analytic"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    rows = [line.split() for line in out.splitlines() if not line.startswith("#")]
    assert [(int(r[0]), r[-1]) for r in rows] == [  # size first, the algorithm last
        (1024, "ring/LL"), (8 * 2**20, "ring/LL128"), (8 * GiB, "ring/Simple")]


def test_sharp_in_a_cluster_file_reaches_the_collectives(capsys, tmp_path):
    """`[cluster] sharp = true` lets NCCL pick CollNet across nodes; a bad value is one line
    on stderr and exit status 2."""
    from sim.cli import main

    path = tmp_path / "sharp.toml"
    path.write_text('[cluster]\npreset = "dgx-a100"\nnodes = 4\nsharp = true\n')
    code = main(["collective", "--cluster", str(path), "--op", "all_reduce", "--sizes", "16M",
                 "--model", "analytic"])
    out, err = capsys.readouterr()
    assert code == 0 and "collnet_direct/Simple" in out
    path.write_text('[cluster]\npreset = "dgx-a100"\nnodes = 4\nsharp = "on"\n')
    code = main(["collective", "--cluster", str(path), "--sizes", "16M"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.strip() == "parasim: error: cluster.sharp: 'on' must be true or false"
