"""The Monte-Carlo against the analytic expectation for exponential failures, its counts
against rate x time, its determinism, and its refusal of runs too big to draw."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.goodput.interval import daly_interval, effective_fraction, expected_wall_time
from sim.goodput.montecarlo import MAX_EVENTS, Cause, RunModel, check_events, simulate_run
from traces.errors import ConfigError

DAY = 86_400.0


def model(*, mtti=6 * 3600.0, delta=120.0, restart=900.0, work=20 * DAY, drain=0.0,
          interval=None, spares=0, repair=0.0, hardware=False) -> RunModel:
    tau = interval or daly_interval(delta, mtti)
    causes = (Cause("gpu", 0.75 / mtti, restart, hardware), Cause("net", 0.25 / mtti,
                                                                   restart, False))
    return RunModel(useful_s=work, work_s=work, interval_s=tau, stall_s=delta, drain_s=drain,
                    causes=causes, spare_nodes=spares, repair_s=repair)


def test_effective_fraction_converges_to_the_analytic_expectation():
    m = model()
    out = simulate_run(m, runs=400, seed=7)
    analytic = effective_fraction(m.work_s, m.interval_s, m.stall_s, 900.0, 6 * 3600.0)
    low, high = out.fraction_interval()
    assert low <= analytic <= high, (low, analytic, high)
    assert high - low < 0.01  # and the interval is tight enough to mean something


def test_event_counts_are_rate_times_wall_time():
    m = model()
    out = simulate_run(m, runs=400, seed=3)
    wall = float(np.mean(out.wall_times_s))
    expected = m.rate_per_s * wall
    n = out.interruptions
    se = float(np.std(n, ddof=1)) / math.sqrt(len(n))
    assert abs(float(np.mean(n)) - expected) < 4 * se
    # and by cause, as their rates split the total: 3 to 1
    assert out.by_cause["gpu"] / out.by_cause["net"] == pytest.approx(3.0, rel=0.05)


def test_same_seed_same_numbers_other_seed_others():
    a = simulate_run(model(), runs=20, seed=11)
    b = simulate_run(model(), runs=20, seed=11)
    c = simulate_run(model(), runs=20, seed=12)
    assert a.wall_times_s.tobytes() == b.wall_times_s.tobytes()
    assert a.by_cause == b.by_cause and a.lost_s_by_cause == b.lost_s_by_cause
    assert a.wall_times_s.tobytes() != c.wall_times_s.tobytes()


def test_no_failures_is_work_plus_checkpoints():
    m = RunModel(useful_s=1000.0, work_s=1000.0, interval_s=300.0, stall_s=10.0, drain_s=0.0,
                 causes=(), spare_nodes=0, repair_s=0.0)
    out = simulate_run(m, runs=3, seed=0)
    assert out.wall_times_s.tolist() == [1040.0] * 3  # 4 checkpoints: 300, 300, 300, 100
    assert out.lost_s_by_cause["checkpoint"] == 40.0


def test_an_asynchronous_write_loses_more_than_its_stall_alone():
    # The same stall; a 10-minute drain during which a failure loses one more interval.
    sync = simulate_run(model(delta=20.0), runs=200, seed=5)
    drained = simulate_run(model(delta=20.0, drain=600.0), runs=200, seed=5)
    assert drained.effective_fraction < sync.effective_fraction


def test_spare_nodes_cut_the_wait_for_repairs():
    none = simulate_run(model(hardware=True, repair=4 * 3600.0), runs=50, seed=2)
    spares = simulate_run(model(hardware=True, repair=4 * 3600.0, spares=8), runs=50, seed=2)
    assert spares.effective_fraction > none.effective_fraction + 0.1


def test_a_run_too_big_to_draw_is_refused_before_it_starts():
    m = model(mtti=60.0, delta=1.0)
    wall = expected_wall_time(m.work_s, m.interval_s, 1.0, 900.0, 60.0)
    with pytest.raises(ConfigError, match=f"more than {MAX_EVENTS:,}"):
        check_events(m, 200, wall)
