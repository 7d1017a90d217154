"""Young's and Daly's intervals against their closed forms and Daly's own example, and the
analytic expectation against a direct sum."""

from __future__ import annotations

import math

import pytest

from sim.goodput.interval import (
    daly_interval,
    effective_fraction,
    expected_wall_time,
    segment_time,
    young_interval,
)

MIN = 60.0
HOUR = 3600.0


def test_daly_2006_example_mtti_24h_write_5min():
    # Daly 2006 (FGCS 22(3)), §4: M = 24 h, δ = 5 min, R = 10 min -> about 117 min; Young 120.
    assert young_interval(5 * MIN, 24 * HOUR) == pytest.approx(120 * MIN, rel=1e-12)
    daly = daly_interval(5 * MIN, 24 * HOUR)
    assert round(daly / MIN) == 117
    # the closed form, written out: sqrt(2δM)[1 + sqrt(δ/2M)/3 + (δ/2M)/9] − δ
    x = 5 / (2 * 24 * 60)
    assert daly / MIN == pytest.approx(120 * (1 + math.sqrt(x) / 3 + x / 9) - 5, rel=1e-12)


def test_daly_is_the_mtti_once_the_write_reaches_twice_it():
    assert daly_interval(2 * HOUR, HOUR) == HOUR
    assert daly_interval(5 * HOUR, HOUR) == HOUR


def test_daly_optimum_maximises_the_analytic_fraction():
    # Daly's estimate sits within 0.1% of the true optimum of his own model for δ << M.
    delta, restart, mtti, work = 5 * MIN, 10 * MIN, 24 * HOUR, 1000 * HOUR
    best = effective_fraction(work, daly_interval(delta, mtti), delta, restart, mtti)
    for factor in (0.5, 0.8, 1.25, 2.0):
        other = effective_fraction(work, factor * daly_interval(delta, mtti), delta, restart,
                                   mtti)
        assert other < best


def test_no_failures_is_the_checkpoint_overhead_alone():
    assert segment_time(100.0, 5.0, 60.0, math.inf) == 105.0
    assert effective_fraction(1000.0, 100.0, 5.0, 60.0, math.inf) == pytest.approx(100 / 105)


def test_expected_wall_time_sums_its_segments():
    m, r, d = 7200.0, 300.0, 30.0
    one = m * math.exp(r / m) * math.expm1((600.0 + d) / m)  # Daly's eq. for one segment
    last = m * math.exp(r / m) * math.expm1((250.0 + d) / m)
    assert expected_wall_time(3250.0, 600.0, d, r, m) == pytest.approx(5 * one + last,
                                                                       rel=1e-12)
