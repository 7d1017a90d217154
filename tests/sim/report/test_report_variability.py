"""The MFU waterfall shows per-rank variability (`[cluster] jitter`, `slow_nodes`) as its own
step, taken from the kernel time, and still adds up to MFU; without variability it is absent."""

import pytest

from sim.config import experiment_from_dict
from sim.report import read_payload, render_report
from sim.report.breakdown import waterfall
from sim.report.timeline import rank_ops
from sim.simulate import predict
from tests.sim.report.report_cases import TP2_PP2_DP2


def varied(**cluster):
    return experiment_from_dict({**TP2_PP2_DP2,
                                 "cluster": {**TP2_PP2_DP2["cluster"], **cluster}})


def test_the_waterfall_shows_the_variability_and_adds_up():
    exp = varied(jitter=0.05, slow_nodes=0.1, slow_factor=1.3)
    summary, times = predict(exp)
    ideal, ideal_times = predict(varied())
    w = waterfall(exp, summary, [rank_ops(times, r) for r in times.plan.ranks])
    w0 = waterfall(exp, ideal, [rank_ops(ideal_times, r) for r in ideal_times.plan.ranks])
    assert sum(v for _, v in w.steps()) + w.mfu == pytest.approx(1.0, abs=1e-12)
    assert w.variability == pytest.approx(
        (summary.compute_s - ideal.compute_s) / summary.step_time_s, rel=1e-12)
    assert w.variability > 0 and "variability (slowest ranks)" in dict(w.steps())
    # the kernels' own efficiency is what it was; only the step grew
    assert w.kernel_efficiency * summary.step_time_s == pytest.approx(
        w0.kernel_efficiency * ideal.step_time_s, rel=1e-9)
    assert "variability (slowest ranks)" not in dict(w0.steps())
    figure = read_payload(render_report(exp, summary, times))["figures"]["parasim-waterfall"]
    assert "variability (slowest ranks)" in figure["data"][0]["x"]
