"""MTTF against job size on RSC-1 (`sim.goodput.laws`) against Kokolis et al. (HPCA 2025):
47.7 days measured at 8 GPUs and 7.9 h at 1,024; 1.8 h projected at 16,384 and 0.23 h at
131,072 from 6.50 failures per 1,000 node-days."""

from __future__ import annotations

import math

import pytest

from sim.goodput.fleets import FLEETS
from sim.goodput.laws import (
    MEASURED_H,
    MEASURED_WEIBULL,
    PROJECTED_H,
    lemon_mttf_h,
    per_node_mttf_h,
    weibull_through,
)
from sim.goodput.rates import Component, component_counts, job_rates, mtti_s
from topology import build_cluster


@pytest.mark.parametrize(("gpus", "published_h"), sorted(PROJECTED_H.items()))
def test_the_per_node_law_is_the_papers_projection(gpus, published_h):
    # their 1.8 h and 0.23 h are 1 / (nodes x 6.5e-3 per day), to the digits they print
    assert round(per_node_mttf_h(gpus), 2 if gpus > 16_384 else 1) == published_h


def test_the_per_node_law_misses_the_measured_1024_gpu_mttf():
    assert per_node_mttf_h(1_024) == pytest.approx(28.85, abs=0.01)
    assert per_node_mttf_h(1_024) / MEASURED_H[1_024] > 3.5


def test_the_measured_points_give_an_exponential_weibull():
    w = MEASURED_WEIBULL
    assert w.mttf_h(8) == pytest.approx(47.7 * 24) and w.mttf_h(1_024) == pytest.approx(7.9)
    # shape ln 128 / ln(1144.8 / 7.9): within 3% of 1, the exponential
    assert w.shape == pytest.approx(math.log(128) / math.log(47.7 * 24 / 7.9))
    assert 0.97 < w.shape < 1.0
    # so it cannot reach the projected 1.8 h at 16,384 GPUs: about a quarter of it
    assert w.mttf_h(16_384) == pytest.approx(0.46, abs=0.005)


def test_a_weibull_through_two_figures_meets_them_and_its_scale_has_gamma():
    w = weibull_through((1_024, 7.9), (16_384, 1.8))
    assert w.shape == pytest.approx(math.log(16) / math.log(7.9 / 1.8))
    assert (w.mttf_h(1_024), w.mttf_h(16_384)) == pytest.approx((7.9, 1.8))
    assert w.scale_h(1_024) * math.gamma(1 + 1 / w.shape) == pytest.approx(7.9)


def test_the_lemon_law_meets_1024_and_holds_16k_within_25_percent():
    assert lemon_mttf_h(1_024) == pytest.approx(7.9)
    assert lemon_mttf_h(16_384) == pytest.approx(1.5466, abs=1e-3)
    assert abs(lemon_mttf_h(16_384) / PROJECTED_H[16_384] - 1) < 0.25


@pytest.mark.parametrize("gpus", [1_024, 16_384])
def test_the_rsc1_fleet_on_a_built_cluster_is_the_lemon_law(gpus):
    counts = component_counts(build_cluster("dgx-a100", nodes=gpus // 8))
    mtti_h = mtti_s(job_rates(FLEETS["rsc1"].rates_per_hour, counts)) / 3600
    assert mtti_h == pytest.approx(lemon_mttf_h(gpus))
    assert FLEETS["rsc1"].rates_per_hour[Component.HOST] * 24 * 1000 == pytest.approx(6.5)


def test_the_lemon_law_is_refuted_by_the_8_gpu_measurement():
    # one hazard per job whatever its size: 8-GPU jobs would fail every 11 h, not 47.7 days
    assert lemon_mttf_h(8) == pytest.approx(10.85, abs=0.01)
    assert lemon_mttf_h(8) < MEASURED_H[8] / 100
