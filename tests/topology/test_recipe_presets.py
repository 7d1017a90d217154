"""The presets of published recipes' clusters, each figure against its cited specification:
DeepSeek-V3's H800s, torchtitan's 96 GB H100s at 500 W, DGX B300 and GB300 NVL72."""

from __future__ import annotations

import pytest

from topology.config import build_cluster
from topology.presets import PRESETS

NEW = ("dgx-h800", "h100-96gb", "dgx-b300", "gb300-nvl72")


def test_the_new_presets_are_registered_and_build():
    for name in NEW:
        assert name in PRESETS
        cluster = build_cluster(name, nodes=2)
        assert len(cluster.devices) == 2 * PRESETS[name].server.gpus


def test_dgx_h800_is_the_h100_die_with_8_nvlinks_and_8_ndr_nics():
    p = PRESETS["dgx-h800"]
    assert p.accelerator == PRESETS["dgx-h100"].accelerator  # BF16 989.4, FP8 1978.9, 3.35 TB/s
    assert p.server.nvlink_Bps * 2 == 400e9  # H800 SXM data sheet: NVLink 400 GB/s both ways
    assert p.server.nvlink_Bps == 8 * 25e9  # 8 NVLink 4 links of 25 GB/s a direction
    assert (p.server.nics, p.server.nic_Bps * 8) == (8, 400e9)  # 8 x 400G CX7 (DeepSeek-V3)


def test_h100_96gb_is_torchtitans_grand_teton_h100():
    a = PRESETS["h100-96gb"].accelerator
    assert (a.memory_bytes, a.hbm_bandwidth_Bps) == (96e9, 2.4e12)  # 96GB HBM2e, 2.4 TB/s
    assert a.peak_flops == PRESETS["dgx-h100"].accelerator.peak_flops  # the H100 die
    # at its 500 W: H100's 1450 MHz at 700 W times an H100 HBM2e's bf16 pre-training rate at a
    # 500 W cap over its rate at 700 W (Mayr et al., arXiv 2603.16164, Table 4)
    assert a.sustained_clock_MHz == pytest.approx(1450 * 27705.3 / 30271.0, rel=1e-12)
    s = PRESETS["h100-96gb"].server
    assert s.gpus == 8 and s.nic_Bps * 8 == 400e9  # 400 Gb/s per GPU between hosts


@pytest.mark.parametrize(("name", "gpus", "bf16", "fp8"), [
    ("dgx-b300", 8, 72e15 / 8 / 4, 72e15 / 8 / 2),  # 72 PF FP8 sparse for 8 GPUs
    ("gb300-nvl72", 72, 360e15 / 72 / 2, 720e15 / 72 / 2),  # 360 / 720 PF sparse for 72
])
def test_blackwell_ultra_figures_are_the_spec_pages(name, gpus, bf16, fp8):
    p = PRESETS[name]
    a = p.accelerator
    assert p.server.gpus == gpus
    assert a.peak_flops == pytest.approx(bf16, rel=1e-12)
    assert a.peak_flops_fp8 == pytest.approx(fp8, rel=1e-12)
    assert (a.memory_bytes, a.hbm_bandwidth_Bps, a.compute_units) == (288e9, 8e12, 160)
    assert p.server.nvlink_Bps * 2 == 1.8e12  # NVLink 5: 1.8 TB/s a GPU both ways
    assert p.server.nic_Bps * 8 == 800e9 and p.server.nics == gpus  # ConnectX-8 800 Gb/s
    # the clock a dense peak implies at Blackwell's 8192 BF16 FLOP a clock an SM
    assert a.peak_clock_MHz * 1e6 * 160 * 8192 == pytest.approx(bf16, rel=1e-12)
    b200 = PRESETS["dgx-b200"].accelerator  # no soak measurement: B200's sustained ratio
    assert a.sustained_clock_MHz / a.peak_clock_MHz == pytest.approx(
        b200.sustained_clock_MHz / b200.peak_clock_MHz, rel=1e-12)
