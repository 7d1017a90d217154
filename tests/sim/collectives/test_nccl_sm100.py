"""NCCL's model on Blackwell (sm100 B200/GB200, sm103 B300/GB300): the tables' Blackwell rows
and the choices they give, computed by hand from the cited constants (sim.collectives.protocols).
"""

from __future__ import annotations

import pytest

from sim.collectives.nccl import AG, AR, bandwidth, channels, choose, latency
from sim.collectives.nccl_system import compute_capability, system_for
from sim.collectives.protocols import GBPS, US, Algo, Proto
from topology import build_cluster


def b200(nodes: int = 1, preset: str = "dgx-b200"):
    cluster = build_cluster(preset, nodes=nodes)
    return system_for(cluster, tuple(range(cluster.num_devices)))


def test_arch_keys() -> None:
    assert [compute_capability(n) for n in ("B200-SXM-180GB", "GB200-186GB", "B300-SXM-288GB",
                                            "GB300-288GB")] == [100, 100, 103, 103]
    assert compute_capability("H100-SXM5-80GB") == 90
    assert b200(preset="dgx-b300").arch_index == 100  # sm103 reads sm100's tables


def test_b200_graphs() -> None:
    """18 NVLink 5 links (900 GB/s / 50) x 40.1 = 721.8 GB/s. Ring search: 90 GB/s x 8
    channels (720) is the first best, duplicated to 16 x 45; NVLS: 8 x s <= 721.8 x 8/7 from
    90, then 9 x s <= 721.8 gives 80; bwInter the top speed below 160: 90."""
    sys = b200()
    assert sys.nvlinks == 18 and sys.nvlink_Bps == pytest.approx(721.8 * GBPS)
    assert (sys.ring.channels, sys.ring.bw_intra_Bps) == (16, 45 * GBPS)
    assert sys.comm_channels == 32
    assert sys.nvls is not None
    assert (sys.nvls.channels, sys.nvls.bw_intra_Bps, sys.nvls.bw_inter_Bps) == \
        (8, 80 * GBPS, 90 * GBPS)


def test_b200_allreduce_bandwidths() -> None:
    """Bus 16 x 45 = 720 GB/s; x 8/14 for a ring all-reduce. LL: min(282, 720/4) = 180;
    LL128: min(720 x 0.92, 16 x 73.4) = 662.4; NVLS: 8 x 80 x 5/6."""
    sys = b200()
    got = {p: bandwidth(sys, AR, Algo.RING, p) / GBPS for p in Proto}
    assert got[Proto.SIMPLE] == pytest.approx(720 * 8 / 14)
    assert got[Proto.LL] == pytest.approx(180 * 8 / 14)
    assert got[Proto.LL128] == pytest.approx(662.4 * 8 / 14)
    assert bandwidth(sys, AR, Algo.NVLS, Proto.SIMPLE) / GBPS == pytest.approx(8 * 80 * 5 / 6)


def test_b200_allreduce_choice() -> None:
    """ring/LL: 6.6 + 14 x 0.6 = 15.0 us at 102.86 GB/s; NVLS: 23 us at 533.3 GB/s. At 64 KiB
    ring/LL 15.64 us against NVLS 23.12; at 1 MiB NVLS 24.97 us against ring/LL 25.19."""
    sys = b200()
    assert latency(sys, AR, Algo.RING, Proto.LL) == pytest.approx(15.0 * US)
    assert latency(sys, AR, Algo.NVLS, Proto.SIMPLE) == pytest.approx(23.0 * US)
    assert choose(sys, AR, 64 << 10) == (Algo.RING, Proto.LL)
    assert choose(sys, AR, 1 << 20) == (Algo.NVLS, Proto.SIMPLE)
    assert choose(sys, AR, 1 << 30) == (Algo.NVLS, Proto.SIMPLE)
    assert choose(sys, AG, 1 << 30) == (Algo.RING, Proto.SIMPLE)


def test_blackwell_nvls_channels() -> None:
    """ncclNvlsInit on sm100: 24 CTAs on one node, 32 across nodes; no NVLS on 2 GPUs."""
    assert b200().nvls_channels == 24
    assert b200(nodes=2).nvls_channels == 32
    sys = b200()
    assert channels(sys, AR, Algo.NVLS, Proto.SIMPLE, 1 << 30) == (24, 640)
    pair = system_for(build_cluster("dgx-b200", nodes=1), (0, 1))
    assert pair.nvls is None
