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


@pytest.mark.parametrize(("value", "needle"), [
    ("500W", "'500W' is outside H100-SXM5-80GB's measured range (700 W, its TDP 700 W)"),
    ("701W", "'701W' is outside"),
    (float("nan"), "nan is not a finite number"),
    ("0W", "'0W' must be a positive power"),
])
def test_a_limit_outside_the_measurements_is_refused_in_one_line(value, needle):
    with pytest.raises(ConfigError) as err:
        build_cluster("dgx-h100", nodes=1, gpu_power=value)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("cluster.gpu_power: ")
