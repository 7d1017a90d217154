"""NCCL's cost model (sim.collectives.nccl) and what parasim adds to it (nccl_plan).

Figures by hand come from NCCL 2.20.3's src/graph/tuning.cc: on a DGX A100 the ring graph has
12 channels at 20 GB/s, so ring/Simple bus bandwidth is 240 GB/s and its latency 8.4 + 14 x 3.4.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import simpy

from sim.collectives import Collectives, analytic_time
from sim.collectives.nccl import (
    available,
    bandwidth,
    channels,
    choose,
    latency,
    nccl_time,
    options,
)
from sim.collectives.nccl_plan import (
    LAUNCH_SINGLE_THREAD_S,
    NcclPlan,
    gpu_bytes_per_payload,
    pieces,
    plan,
)
from sim.collectives.nccl_system import NcclSystem, system_for
from sim.collectives.protocols import PROTOCOLS, Algo, Proto
from sim.engine.flows import Lowering
from sim.engine.network import Network
from topology import build_cluster
from topology.cluster import Cluster
from traces.errors import ConfigError
from traces.ops import OpKind

AR, RS, AG, BCAST = (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER,
                     OpKind.BROADCAST)
US, GB, MiB = 1e-6, 1e9, 2**20
DATA = Path(__file__).parents[2] / "bench" / "data" / "nccl_tests_allreduce.json"


def node(preset: str, nodes: int = 1) -> NcclSystem:
    cluster = build_cluster(preset, nodes=nodes)
    return system_for(cluster, tuple(range(cluster.num_devices)))


@pytest.fixture(scope="module")
def a100() -> NcclSystem:
    return node("dgx-a100")


@pytest.fixture(scope="module")
def h100() -> NcclSystem:
    return node("dgx-h100")


def busbw(p: NcclPlan, seconds: float) -> float:
    return p.size_bytes / seconds * 2 * (p.num_ranks - 1) / p.num_ranks


def test_graphs_match_nccls_search(a100: NcclSystem, h100: NcclSystem) -> None:
    # DGX A100: 12 NVLinks x 20 GB/s = 240; search 6 x 40, duplicated to 12 x 20; NCCL logs
    # "Channel 00/24" on HGX A100 (nccl-tests#100).
    assert (a100.ring.channels, a100.ring.bw_intra_Bps) == (12, 20 * GB)
    assert a100.comm_channels == 24 and a100.nvls is None
    # DGX H100: 18 x 20.6 = 370.8; 6 x 60 -> 12 x 30. NVLS: (8 + 1) x bw <= 370.8 -> 40.
    assert (h100.ring.channels, h100.ring.bw_intra_Bps) == (12, 30 * GB)
    assert h100.nvls is not None
    assert (h100.nvls.channels, h100.nvls.bw_intra_Bps, h100.nvls.bw_inter_Bps) == \
        (8, 40 * GB, 60 * GB)
    # Across nodes one ring per NDR NIC at 48 GB/s: 16 channels, as nccl#1453 logs.
    multi = node("dgx-h100", nodes=4)
    assert (multi.ring.channels, multi.ring.bw_inter_Bps, multi.comm_channels) == (8, 48 * GB, 16)


def test_tuning_table_by_hand(a100: NcclSystem, h100: NcclSystem) -> None:
    ring = {p: latency(a100, AR, Algo.RING, p) for p in Proto}
    assert ring[Proto.LL] == pytest.approx((6.6 + 14 * 0.6) * US)
    assert ring[Proto.LL128] == pytest.approx((14.0 + 14 * 1.9) * US)
    assert ring[Proto.SIMPLE] == pytest.approx((8.4 + 14 * 3.4) * US)
    # algbw = busbw x n / 2(n-1): Simple 240, LL128 240 x 0.92, LL min(87.7, 240 / 4).
    assert bandwidth(a100, AR, Algo.RING, Proto.SIMPLE) == pytest.approx(240 * GB * 8 / 14)
    assert bandwidth(a100, AR, Algo.RING, Proto.LL128) == pytest.approx(240 * 0.92 * GB * 8 / 14)
    assert bandwidth(a100, AR, Algo.RING, Proto.LL) == pytest.approx(60 * GB * 8 / 14)
    assert latency(a100, AR, Algo.TREE, Proto.SIMPLE) == pytest.approx(14 * 28 * US)
    # NVLS: 23 us, 8 channels x 40 GB/s x 5/6.
    assert latency(h100, AR, Algo.NVLS, Proto.SIMPLE) == pytest.approx(23 * US)
    assert bandwidth(h100, AR, Algo.NVLS, Proto.SIMPLE) == pytest.approx(8 * 40 * GB * 5 / 6)


def test_protocol_moves_from_ll_to_ll128_to_simple(a100: NcclSystem) -> None:
    order = [Proto.LL, Proto.LL128, Proto.SIMPLE]
    picked = []
    for k in range(10, 34):  # 1 KiB .. 8 GiB
        choice = choose(a100, AR, 2**k)
        assert choice is not None and choice[0] is Algo.RING
        picked.append(choice[1])
        assert plan(a100, AR, 2**k).protocol is choice[1]
    assert [order.index(p) for p in picked] == sorted(order.index(p) for p in picked)
    assert set(picked) == set(order)
    assert picked[0] is Proto.LL and picked[-1] is Proto.SIMPLE


def test_latency_at_tiny_sizes_by_hand(a100: NcclSystem) -> None:
    size = 8
    assert nccl_time(a100, AR, Algo.RING, Proto.LL, size) == pytest.approx(
        15.0 * US + size / (60 * GB * 8 / 14))
    # parasim: one channel moves 14 pieces of 8 / 8 bytes, each with a 0.6 us LL handshake.
    p = plan(a100, AR, size)
    assert (p.channels, p.threads) == (1, 64)
    assert pieces(a100, AR, Algo.RING, Proto.LL, size, 1).count == 14
    # One of 24 channels carries LL at llMaxBw 87.7 GB/s (bus) -> 87.7 / 24 x 8 / 14 algbw.
    assert p.bandwidth_Bps == pytest.approx(87.7 * GB / 24 * 8 / 14)
    extra = 14 - 14 * (size / 8) / 32768  # a full LL step holds 32,768 B of data
    assert p.time_s == pytest.approx((15.0 + extra * 0.6) * US + size / p.bandwidth_Bps)
    single_thread = plan(a100, AR, size, launch_s=LAUNCH_SINGLE_THREAD_S)
    assert single_thread.time_s - p.time_s == pytest.approx(LAUNCH_SINGLE_THREAD_S)


def test_bandwidth_at_huge_sizes_by_hand(a100: NcclSystem, h100: NcclSystem) -> None:
    size = 8 * 2**30
    p = plan(a100, AR, size)
    assert (p.algorithm, p.protocol) == (Algo.RING, Proto.SIMPLE)
    assert busbw(p, p.time_s) == pytest.approx(240 * GB, rel=3e-3)
    q = plan(h100, AR, size)
    assert q.algorithm is Algo.NVLS
    assert busbw(q, q.time_s) == pytest.approx(8 * 40 * GB * 5 / 6 * 1.75, rel=3e-3)


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100"])
def test_no_prediction_exceeds_the_links(preset: str) -> None:
    """Every algorithm and protocol, every collective, 1 KiB to 8 GiB: the bytes a GPU pushes
    per second stay under its NVLink line rate and under NCCL's NVLink data rate."""
    sys = node(preset)
    server = build_cluster(preset, nodes=1).fabric.server  # type: ignore[attr-defined]
    for kind in (AR, RS, AG, BCAST):
        for algo in Algo:
            for proto in Proto:
                if not available(sys, kind, algo, proto):
                    continue
                for k in range(10, 34, 3):
                    p = plan(sys, kind, 2**k, algo=algo, proto=proto)
                    sent = p.size_bytes * gpu_bytes_per_payload(kind, algo, sys.num_ranks)
                    rate = sent * p.wire_factor / p.time_s
                    assert rate <= sys.nvlink_Bps <= server.nvlink_Bps, (kind, algo, proto, k)


@pytest.mark.parametrize(("preset", "fabric", "nodes", "sharp"), [
    ("dgx-a100", "fat-tree", 2, False), ("dgx-a100", "rail", 4, True),
    ("dgx-h100", "fat-tree", 4, True), ("dgx-h100", "rail", 2, False),
    ("dgx-h100", "rail", 4, False)])
def test_no_prediction_exceeds_the_links_across_nodes(preset: str, fabric: str, nodes: int,
                                                      sharp: bool) -> None:
    """Several nodes: every algorithm and protocol NCCL has there, every collective, 1 KiB to
    8 GiB. A GPU pushes its bytes over NVLink and its share of the NICs, so no faster than
    both line rates together; and a node's NICs carry at least what the collective must move
    between nodes, whatever the algorithm (in-network reduction included): an all-reduce or
    all-gather brings (nodes - 1)/nodes of the buffer into each node, a reduce-scatter
    1/nodes, a broadcast all of it."""
    cluster = build_cluster(preset, nodes=nodes, fabric=fabric, sharp=sharp)
    sys = system_for(cluster, tuple(range(cluster.num_devices)))
    server = cluster.fabric.server  # type: ignore[attr-defined]
    nics_Bps = server.nics * server.nic_Bps
    per_gpu_Bps = server.nvlink_Bps + nics_Bps / server.gpus
    into_node = {AR: (nodes - 1) / nodes, AG: (nodes - 1) / nodes, RS: 1 / nodes, BCAST: 1.0}
    checked = set()
    for kind in (AR, RS, AG, BCAST):
        for algo in Algo:
            for proto in Proto:
                if not available(sys, kind, algo, proto):
                    continue
                checked.add(algo)
                for k in range(10, 34, 3):
                    p = plan(sys, kind, 2**k, algo=algo, proto=proto)
                    sent = p.size_bytes * gpu_bytes_per_payload(kind, algo, sys.num_ranks)
                    assert sent * p.wire_factor / p.time_s <= per_gpu_Bps, (kind, algo, proto, k)
                    across = p.size_bytes * into_node[kind]
                    assert across / p.time_s <= nics_Bps, (kind, algo, proto, k)
    assert {Algo.RING, Algo.TREE} <= checked
    assert (Algo.COLLNET_DIRECT in checked) is sharp


def test_sharp_key_lets_all_reduce_choose_collnet() -> None:
    """`[cluster] sharp = true`: NCCL's CollNet joins the choice across nodes and wins where
    its predicted time is the lowest; without the key it is never considered."""
    plain = build_cluster("dgx-a100", nodes=4)
    sharp = build_cluster("dgx-a100", nodes=4, sharp=True)
    assert plain.fabric.sharp is False and sharp.fabric.sharp is True  # type: ignore[attr-defined]
    group = tuple(range(32))
    without, with_sharp = system_for(plain, group), system_for(sharp, group)
    assert not without.sharp and with_sharp.sharp and with_sharp.collnet is not None
    size = 16 * MiB
    times = {k: t for k, t in options(with_sharp, AR, size).items()}
    best = min(times, key=times.__getitem__)
    assert best == (Algo.COLLNET_DIRECT, Proto.SIMPLE)
    others = [t for (a, _), t in times.items()
              if a not in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN)]
    assert times[best] < min(others)
    assert all(a not in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN)
               for a, _ in options(without, AR, size))
    name, lowering = Collectives(sharp).resolve(AR, group, size)
    assert name == "collnet_direct/Simple"
    assert analytic_time(sharp, lowering, size) == pytest.approx(
        plan(with_sharp, AR, size).time_s, rel=1e-9)
    assert Collectives(plain).resolve(AR, group, size)[0].split("/")[0] != "collnet_direct"
    # One node has no network to reduce in: the key changes nothing there.
    one = build_cluster("dgx-a100", nodes=1, sharp=True)
    assert system_for(one, tuple(range(8))).collnet is None


def test_mid_sizes_ramp_below_nccls_model(a100: NcclSystem) -> None:
    """NCCL's model is 1.4-1.6x optimistic at 4-16 MiB on A100; parasim's extra pieces
    close most of it and vanish at GiB sizes."""
    for mib in (4, 8, 16):
        p = plan(a100, AR, mib * MiB)
        assert p.time_s / p.nccl_time_s > 1.12
    big = plan(a100, AR, 8 * 2**30)
    assert big.time_s / big.nccl_time_s < 1.01
    # 16 MiB, ring LL128, 24 channels: each of the 14 steps moves 16 MiB / (24 x 8) =
    # 87,381 B where a full step holds 576,000 B: 14 - 14 x 87,381 / 576,000 = 11.88 extra
    # pieces at 1.9 us.
    p = plan(a100, AR, 16 * MiB)
    assert (p.protocol, p.channels) == (Proto.LL128, 24)
    extra = 14 - 14 * (16 * MiB / (24 * 8)) / 576_000
    assert p.latency_s == pytest.approx((40.6 + extra * 1.9) * US)


def test_nvls_halves_its_chunks_below_a_gib(h100: NcclSystem) -> None:
    # 16 channels x 8 heads = 128 concurrent chunks; below 64 x 128 x 128 KiB = 1 GiB NCCL
    # uses 64 KiB chunks: twice the pieces, each a 3.4 us Simple step.
    half = pieces(h100, AR, Algo.NVLS, Proto.SIMPLE, 512 * MiB, 16)
    assert half.piece_bytes == 64 * 1024 and half.count == 64 and half.full == 32
    full = pieces(h100, AR, Algo.NVLS, Proto.SIMPLE, 2**30, 16)
    assert full.extra == 0


def test_channels_drop_for_small_sizes(a100: NcclSystem) -> None:
    # Ring LL: threshold 8 B/thread x 8 ranks, 512 threads per channel.
    assert channels(a100, AR, Algo.RING, Proto.LL, 1024) == (1, 64)
    assert channels(a100, AR, Algo.RING, Proto.LL, 64 * 1024) == (2, 512)
    assert channels(a100, AR, Algo.RING, Proto.LL, MiB) == (24, 512)
    slow = plan(a100, AR, 64 * 1024, algo=Algo.RING, proto=Proto.LL)
    fast = plan(a100, AR, MiB, algo=Algo.RING, proto=Proto.LL)
    assert slow.bandwidth_Bps == pytest.approx(fast.bandwidth_Bps * 2 / 24)


def test_algorithms_by_machine(a100: NcclSystem, h100: NcclSystem) -> None:
    assert not available(a100, AR, Algo.NVLS, Proto.SIMPLE)
    assert available(h100, AR, Algo.NVLS, Proto.SIMPLE)
    assert not available(h100, AR, Algo.NVLS, Proto.LL)
    assert not available(h100, AR, Algo.COLLNET_DIRECT, Proto.SIMPLE)
    assert choose(h100, BCAST, MiB) == (Algo.RING, Proto.SIMPLE)
    assert choose(h100, AR, 2**30) == (Algo.NVLS, Proto.SIMPLE)
    multi = node("dgx-h100", nodes=4)
    assert available(multi, AR, Algo.NVLS_TREE, Proto.SIMPLE)
    assert not available(multi, AR, Algo.NVLS, Proto.SIMPLE)
    sharp = NcclSystem(num_nodes=4, gpus_per_node=8, compute_capability=90, nvlinks=18,
                       nics_per_node=8, nic_Bps=50 * GB, sharp=True)
    assert available(sharp, AR, Algo.COLLNET_DIRECT, Proto.SIMPLE)
    assert available(sharp, AR, Algo.NVLS, Proto.SIMPLE)
    assert choose(sharp, AR, 2**30) is not None
    assert plan(sharp, AR, 2**30, algo=Algo.COLLNET_CHAIN).algorithm is Algo.COLLNET_CHAIN


def test_wire_factors() -> None:
    assert PROTOCOLS[Proto.LL].wire_factor == 2.0
    assert PROTOCOLS[Proto.LL128].wire_factor == pytest.approx(128 / 120)
    assert PROTOCOLS[Proto.SIMPLE].wire_factor == 1.0
    p = plan(node("dgx-a100"), AR, MiB, algo=Algo.RING, proto=Proto.LL)
    # LL over 12 x 20 GB/s moves 240 / 2 = 120 GB/s of data, capped at llMaxBw 87.7.
    assert p.bandwidth_Bps == pytest.approx(87.7 * GB * 8 / 14)
    link_algbw = 240 * GB * 8 / 14
    assert p.wire_bytes_factor(link_algbw) == pytest.approx(240 / 87.7)
    assert plan(node("dgx-a100"), AR, 2**30).wire_bytes_factor(link_algbw) == pytest.approx(1.0)


def test_user_errors(a100: NcclSystem) -> None:
    with pytest.raises(ConfigError, match="all_to_all"):
        plan(a100, OpKind.ALL_TO_ALL, MiB)
    with pytest.raises(ConfigError, match="uneven"):
        system_for(build_cluster("dgx-a100", nodes=2), (0, 1, 2, 8))
    with pytest.raises(ConfigError, match="not a switched GPU cluster"):
        system_for(build_cluster("tpu-v4", nodes=16), (0, 1))
    with pytest.raises(ConfigError, match="no NCCL algorithm nvls"):
        plan(a100, AR, MiB, algo=Algo.NVLS)


@pytest.mark.parametrize("system", ["dgx-a100", "dgx-h100"])
def test_published_nccl_tests_within_15_percent(system: str) -> None:
    """MAPE against the median of the published runs, 1 MiB to 8 GiB (data file cites each);
    NCCL's own model misses by more."""
    sources = [s for s in json.loads(DATA.read_text())["sources"] if s["system"] == system]
    sys = node(system)
    ours, ncclm = [], []
    for k in range(20, 34):
        values = [s["busbw_GBps"][str(2**k)] for s in sources if str(2**k) in s["busbw_GBps"]]
        if not values:
            continue
        measured = statistics.median(values) * GB
        p = plan(sys, AR, 2**k)
        ours.append(abs(busbw(p, p.time_s) - measured) / measured)
        ncclm.append(abs(busbw(p, p.nccl_time_s) - measured) / measured)
    assert len(ours) >= 6
    assert statistics.mean(ours) <= 0.15
    assert statistics.mean(ours) < statistics.mean(ncclm)


def _flow_seconds(cluster: Cluster, lowerings: list[Lowering], size: float) -> float:
    """Flow model: these lowerings started together; seconds until the last one ends."""
    env = simpy.Environment()
    net = Network(env, cluster.link_capacity)
    done = [net.run(net.register(low), size) for low in lowerings]
    env.run(until=simpy.AllOf(env, done))
    return env.now


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100"])
def test_auto_runs_nccls_choice_in_the_flow_model(preset: str) -> None:
    """`auto` on an NVSwitch node: NCCL's algorithm and protocol, whose flows take the plan's
    closed-form time alone and share the links with a second collective on them."""
    cluster = build_cluster(preset, nodes=1)
    group = tuple(range(8))
    col = Collectives(cluster)
    sys = col.nccl_system(group)
    assert sys is not None
    for size in (4 * MiB, 16 * MiB, 2**30):
        p = plan(sys, AR, size)
        name, lowering = col.resolve(AR, group, size)
        assert name == f"{p.algorithm}/{p.protocol}"
        assert analytic_time(cluster, lowering, size) == pytest.approx(p.time_s, rel=1e-9)
        assert _flow_seconds(cluster, [lowering], size) == pytest.approx(p.time_s, rel=1e-9)
        # Two at once on the same links: the latency once, the bytes twice.
        both = _flow_seconds(cluster, [lowering, lowering], size)
        assert both == pytest.approx(p.latency_s + 2 * (p.time_s - p.latency_s), rel=1e-6)
    # Named algorithms keep their plain lowerings (no protocol), and torus clusters `auto`.
    assert col.resolve(AR, group, MiB, "rhd")[0] == "rhd"
    # All-to-all is NCCL's grouped sends (sim.collectives.nccl_p2p): 128 KiB a peer is at
    # most 32 channels x 16 KiB, so LL; `direct` stays parasim's flows without NCCL's costs.
    assert col.resolve(OpKind.ALL_TO_ALL, group, MiB)[0] == "p2p/LL"
    assert col.resolve(OpKind.ALL_TO_ALL, group, MiB, "direct")[0] == "direct"
