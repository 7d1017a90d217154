"""NCCL on a GB200/GB300 NVL72 rack (multi-node NVLink, MNNVL): the clique is one NCCL node,
racks are nodes, and the figures NCCL's model gives there, by hand from the cited constants
(sim.collectives.protocols, sim.collectives.nccl_system)."""

from __future__ import annotations

import dataclasses

import pytest

from sim.collectives.nccl import (
    AG,
    AR,
    NCCL_KINDS,
    RS,
    available,
    channels,
    choose,
    latency,
    ll_max_bw,
    nccl_time,
    options,
)
from sim.collectives.nccl_system import host_cpu, system_for
from sim.collectives.protocols import GBPS, US, Algo, Proto
from topology import build_cluster
from traces.errors import ConfigError


def test_group_inside_one_rack_is_one_node() -> None:
    """A group of any size inside one rack is one MNNVL node of len(group) GPUs."""
    cluster = build_cluster("gb200-nvl72", nodes=1)
    for group in (tuple(range(4)), tuple(range(12)), tuple(range(0, 72, 9)), tuple(range(72))):
        sys = system_for(cluster, group)
        assert (sys.num_nodes, sys.gpus_per_node, sys.nvlinks) == (1, len(group), 18)
    cut = build_cluster("gb300-nvl72", nodes=1, gpus_per_node=8)  # an 8-GPU slice of a rack
    assert (system_for(cut, tuple(range(8))).num_nodes,
            system_for(cut, tuple(range(8))).gpus_per_node) == (1, 8)


def test_group_across_racks_has_a_node_per_rack() -> None:
    """Nodes = racks; NICs = four a tray for the trays holding the group's ranks in a rack."""
    cluster = build_cluster("gb300-nvl72", nodes=4, gpus_per_node=64)
    whole = system_for(cluster, tuple(range(256)))
    assert (whole.num_nodes, whole.gpus_per_node, whole.nics_per_node) == (4, 64, 16 * 4)
    strided = system_for(cluster, tuple(range(0, 256, 8)))  # ranks 0, 8, ... 56 of each rack
    assert (strided.num_nodes, strided.gpus_per_node, strided.nics_per_node) == (4, 8, 8 * 4)
    pair = system_for(cluster, (0, 1, 64, 65))  # one tray in each of two racks
    assert (pair.num_nodes, pair.gpus_per_node, pair.nics_per_node) == (2, 2, 4)
    with pytest.raises(ConfigError, match="uneven"):
        system_for(cluster, (0, 1, 64))


def test_rack_allreduce_closed_form() -> None:
    """One GB200 rack, 72 GPUs. NVLS keeps 32 heads (NCCL_MAX_NVLS_ARITY): the start speed is
    the first with 32 x s <= 721.8 x 72/71 (20), kept since 33 x 20 <= 721.8; bwInter 30.
    All-reduce: 23 us + S / (32 x min(20, 30) x 5/6 GB/s). The ring is a DGX B200's: 16 x 45,
    and its latency counts 142 NVLink steps: LL 6.6 + 142 x 0.6 = 91.8 us."""
    sys = system_for(build_cluster("gb200-nvl72", nodes=1), tuple(range(72)))
    assert sys.nvls is not None
    assert (sys.nvls.channels, sys.nvls.bw_intra_Bps, sys.nvls.bw_inter_Bps) == \
        (32, 20 * GBPS, 30 * GBPS)
    assert (sys.ring.channels, sys.ring.bw_intra_Bps) == (16, 45 * GBPS)
    assert latency(sys, AR, Algo.RING, Proto.LL) == pytest.approx(91.8 * US)
    size = float(1 << 30)
    assert nccl_time(sys, AR, Algo.NVLS, Proto.SIMPLE, size) == \
        pytest.approx(23 * US + size / (32 * 20 * GBPS * 5 / 6), rel=1e-12)
    assert nccl_time(sys, AR, Algo.RING, Proto.SIMPLE, size) == \
        pytest.approx((8.4 + 142 * 3.4) * US + size / (16 * 45 * GBPS * 72 / 142), rel=1e-12)
    for size in (64 << 10, 1 << 20, 1 << 30):
        assert choose(sys, AR, size) == (Algo.NVLS, Proto.SIMPLE)
    assert channels(sys, AR, Algo.NVLS, Proto.SIMPLE, 1 << 30) == (24, 640)  # one MNNVL node


def test_nvls_reduce_scatter_stops_at_arity() -> None:
    """NVLS reduce-scatter and all-gather need at most 32 local ranks (enqueue.cc)."""
    cluster = build_cluster("gb200-nvl72", nodes=1)
    big, small = system_for(cluster, tuple(range(64))), system_for(cluster, tuple(range(32)))
    for kind in (RS, AG):
        assert not available(big, kind, Algo.NVLS, Proto.SIMPLE)
        assert available(small, kind, Algo.NVLS, Proto.SIMPLE)
    assert available(big, AR, Algo.NVLS, Proto.SIMPLE)


@pytest.mark.parametrize(("dgx", "rack"), [("dgx-b200", "gb200-nvl72"),
                                           ("dgx-b300", "gb300-nvl72")])
def test_eight_gpu_mnnvl_group_is_a_dgx_node(dgx: str, rack: str) -> None:
    """8 GPUs of a rack and a DGX node of 8 give NCCL the same inputs (one node, 18 NVLink 5
    links, the same arch key; NICs are trimmed on one node and the CPU reads only across
    nodes), so every time and channel count agrees."""
    node = system_for(build_cluster(dgx, nodes=1), tuple(range(8)))
    group = system_for(build_cluster(rack, nodes=1), tuple(range(8, 16)))
    for kind in NCCL_KINDS:
        for size in (4 << 10, 1 << 20, 1 << 30):
            assert options(group, kind, size) == options(node, kind, size)
            for algo, proto in options(node, kind, size):
                assert channels(group, kind, algo, proto, size) == \
                    channels(node, kind, algo, proto, size)


def test_grace_reads_as_intel() -> None:
    """GB200/GB300 trays carry NVIDIA Grace: NCCL sees Arm (no vendor), and its multi-node LL cap
    and net overhead read Intel's row (tuning.cc): arm and intel give the same figures."""
    assert [host_cpu(n) for n in ("GB200-186GB", "GB300-288GB", "A100-SXM4-80GB",
                                  "H100-SXM5-80GB", "B200-SXM-180GB")] == \
        ["arm", "arm", "amd", "intel", "intel"]
    sys = system_for(build_cluster("gb200-nvl72", nodes=2, gpus_per_node=64), tuple(range(128)))
    assert sys.cpu_vendor == "arm"
    intel = dataclasses.replace(sys, cpu_vendor="intel")
    assert ll_max_bw(sys) == ll_max_bw(intel) == 39.0 * GBPS
    for proto in Proto:
        assert latency(sys, AR, Algo.RING, proto) == latency(intel, AR, Algo.RING, proto)
