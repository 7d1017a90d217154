"""`[cluster] gpu_power`: the sustained clock at a board power limit (`topology.power`)."""

from __future__ import annotations

import pytest

from topology import presets
from topology.config import build_cluster
from topology.power import CURVES, PowerCurve, at_clock, read_gpu_power
from traces.errors import ConfigError
from traces.units import parse_power


@pytest.mark.parametrize(("text", "watts"), [("500W", 500.0), ("500 W", 500.0), ("1.4kW", 1400.0),
                                             (700, 700.0), (612.5, 612.5), ("7e2W", 700.0)])
def test_power_is_read_as_people_write_it(text, watts):
    assert parse_power(text, "p") == watts


@pytest.mark.parametrize("name", sorted(CURVES))
def test_at_its_tdp_an_accelerator_is_its_preset_unchanged(name):
    accelerator = next(a for a in vars(presets).values()
                       if isinstance(a, presets.Accelerator) and a.name == name)
    curve = CURVES[name]
    assert curve.points[-1] == (curve.tdp_W, accelerator.sustained_clock_MHz)
    assert read_gpu_power(f"{curve.tdp_W:g}W", accelerator, "p") is accelerator


def test_the_torchtitan_h100s_default_to_their_500_w_limit():
    assert CURVES["H100-SXM5-96GB"].tdp_W == 500.0  # torchtitan: "the default 500W power limit"
    plain = build_cluster("h100-96gb", nodes=1).accelerator
    assert build_cluster("h100-96gb", nodes=1, gpu_power="500 W").accelerator == plain


def test_between_measured_points_the_clock_is_linear_and_outside_them_none():
    curve = PowerCurve(700.0, ((400.0, 1100.0), (700.0, 1400.0)))
    assert curve.clock_MHz(500.0) == pytest.approx(1100.0 + 300.0 * 100.0 / 300.0)
    assert (curve.clock_MHz(400.0), curve.clock_MHz(700.0)) == (1100.0, 1400.0)
    assert curve.clock_MHz(399.0) is None and curve.clock_MHz(701.0) is None


def test_a_lower_clock_scales_flops_and_draws_but_not_hbm():
    h100 = presets.H100_SXM
    capped = at_clock(h100, 1160.0)  # 0.8 of the 1450 MHz
    assert capped.sustained_flops == pytest.approx(0.8 * h100.sustained_flops, rel=1e-12)
    assert capped.sustained_flops_fp8 == pytest.approx(0.8 * h100.sustained_flops_fp8, rel=1e-12)
    assert capped.int32_ops_per_s == pytest.approx(0.8 * h100.int32_ops_per_s, rel=1e-12)
    assert capped.sustained_hbm_Bps == h100.sustained_hbm_Bps  # HBM's clock is not capped
    assert capped.peak_flops == h100.peak_flops  # MFU stays against the data sheet


@pytest.mark.parametrize(("preset", "value", "needle"), [
    ("dgx-h100", "199W", "'199W' is outside H100-SXM5-80GB's measured range (200 W to 700 W, "
                         "its TDP 700 W)"),
    ("dgx-h100", "701W", "'701W' is outside"),
    ("h100-96gb", "600W", "'600W' is outside H100-SXM5-96GB's measured range (200 W to 500 W, "
                          "its TDP 500 W)"),
    ("dgx-a100", "300W", "'300W' is outside A100-SXM4-80GB's measured range (400 W, its TDP"),
    ("dgx-h100", float("nan"), "nan is not a finite number"),
    ("dgx-h100", "0W", "'0W' must be a positive power"),
])
def test_a_limit_outside_the_measurements_is_refused_in_one_line(preset, value, needle):
    with pytest.raises(ConfigError) as err:
        build_cluster(preset, nodes=1, gpu_power=value)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("cluster.gpu_power: ")


# Mayr et al., arXiv 2603.16164, Table 4, "Pre-training / H100": LLaMA 3 8B tokens/s per GPU at
# each board power cap; the rule scales H100's cited 1450 MHz at 700 W by the ratio to 700 W.
MAYR_H100 = {200: 9699.3, 300: 17982.3, 400: 24853.4, 500: 27705.3, 600: 29250.0, 700: 30271.0}


@pytest.mark.parametrize("watts", sorted(MAYR_H100))
def test_at_each_measured_cap_an_h100_sustains_its_cited_rate_times_the_studys_ratio(watts):
    h100 = presets.H100_SXM
    ratio = MAYR_H100[watts] / MAYR_H100[700]
    capped = build_cluster("dgx-h100", nodes=1, gpu_power=f"{watts}W").accelerator
    assert capped.sustained_clock_MHz == pytest.approx(1450 * ratio, rel=1e-12)
    assert capped.sustained_flops == pytest.approx(h100.sustained_flops * ratio, rel=1e-12)
    assert capped.sustained_flops_fp8 == pytest.approx(h100.sustained_flops_fp8 * ratio,
                                                       rel=1e-12)
    assert capped.sustained_hbm_Bps == h100.sustained_hbm_Bps


def test_between_two_measured_h100_caps_the_clock_is_the_straight_line():
    clock = build_cluster("dgx-h100", nodes=1, gpu_power="450W").accelerator.sustained_clock_MHz
    at_400, at_500 = (1450 * MAYR_H100[w] / MAYR_H100[700] for w in (400, 500))
    assert clock == pytest.approx((at_400 + at_500) / 2, rel=1e-12)


def test_the_torchtitan_h100_sustains_the_h100_curves_500_w_point():
    titan = presets.H100_96GB
    h100_at_500 = build_cluster("dgx-h100", nodes=1, gpu_power="500W").accelerator
    assert titan.sustained_clock_MHz == h100_at_500.sustained_clock_MHz
    assert titan.sustained_flops == h100_at_500.sustained_flops
    assert titan.sustained_clock_MHz == pytest.approx(1450 * 27705.3 / 30271.0, rel=1e-12)
    # below its TDP it follows the same measured points as the H100 SXM
    titan_at_400 = build_cluster("h100-96gb", nodes=1, gpu_power="400W").accelerator
    h100_at_400 = build_cluster("dgx-h100", nodes=1, gpu_power="400W").accelerator
    assert titan_at_400.sustained_clock_MHz == h100_at_400.sustained_clock_MHz


@pytest.mark.parametrize("name", sorted(set(CURVES) - {"H100-SXM5-80GB", "H100-SXM5-96GB"}))
def test_a_gpu_without_a_published_measurement_below_its_tdp_holds_its_tdp_point_only(name):
    assert CURVES[name].points == ((CURVES[name].tdp_W, CURVES[name].points[0][1]),)
