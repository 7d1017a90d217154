"""Issue 36's hostile sweep, goodput classes: a zero or denormal checkpoint write, a restart or
repair far longer than the MTTI, every failure rate 0 (an infinite MTTI), a spare pool that
failures drain, and a Monte-Carlo that would draw without end. Each is one line and exit 2,
or the correct result."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sim.cli import main
from sim.goodput import montecarlo
from sim.goodput.bounds import MAX_WALL_S, check_finishes, check_spares, log_segment_time
from sim.goodput.interval import segment_time
from sim.goodput.montecarlo import Cause, RunModel, simulate_run
from sim.goodput.rates import Component
from traces.errors import ConfigError

BASE = """[model]
layers = 4
hidden = 256
heads = 16
seq_len = 128
vocab = 1024
[parallel]
tp = 2
pp = 2
dp = 4
global_batch = 16
[cluster]
preset = "dgx-h100"
nodes = 2
fabric = "rail"
[reliability]
"""
NO_FAILURES = "[reliability.rates]\n" + "".join(
    f"{c} = 0\n" for c in Component if c is not Component.SDC)


def goodput(tmp_path: Path, capsys, reliability: str, *flags: str) -> tuple[int, str, str]:
    config = tmp_path / "g.toml"
    config.write_text(BASE + reliability)
    code = main(["goodput", str(config), "--runs", "20", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def refused(result: tuple[int, str, str], needle: str) -> None:
    code, out, err = result
    assert (code, out) == (2, ""), err
    assert err.startswith("parasim: error: ") and err.count("\n") == 1, err
    assert needle in err, err


@pytest.mark.parametrize("write", ['"0s"', "1e-300", "5e-324"])
def test_a_free_checkpoint_is_taken_once_a_step(tmp_path, capsys, write):
    code, out, err = goodput(tmp_path, capsys, f"checkpoint_write = {write}\n", "--json")
    assert code == 0, err
    result = json.loads(out)
    # the interval is floored at one step: the tiny job's step, 1.64 ms on two DGX H100s
    step = 16 * 128 / 1_249_590  # global batch x seq_len / tokens per second, as printed
    assert result["checkpoint_interval_s"] == pytest.approx(step, rel=1e-3)
    assert 0.99 < result["effective_training_fraction"] <= 1.0


def test_an_interval_shorter_than_a_step_is_refused(tmp_path, capsys):
    refused(goodput(tmp_path, capsys, 'checkpoint_interval = "1ms"\n'),
            "reliability.checkpoint_interval: 0.001 s is shorter than one step")


@pytest.mark.parametrize("reliability", [
    'restart = "29d"\nmtti = "1min"\n',
    'restart = "1d"\nmtti = "10min"\n',
    'repair = "29d"\nrestart = "10d"\n[reliability.rates]\ngpu = 0.5\n',
])
def test_a_restart_far_longer_than_the_mtti_is_refused(tmp_path, capsys, reliability):
    refused(goodput(tmp_path, capsys, reliability),
            "the run is expected to take more than a century")


def test_log_segment_time_is_the_log_of_dalys_segment_where_that_is_finite():
    for work, delta, restart, mtti in [(3600, 60, 600, 86400), (10, 1e-9, 5, 3), (1, 0, 0, 1e9)]:
        assert log_segment_time(work, delta, restart, mtti) == pytest.approx(
            math.log(segment_time(work, delta, restart, mtti)), rel=1e-9)
    check_finishes(3600.0, 3600.0, 60.0, 600.0, 86400.0)  # an ordinary run passes
    with pytest.raises(ConfigError):  # e^(R/M) alone: 700 x M restarts
        check_finishes(1.0, 1.0, 0.0, 700.0 * 60, 60.0)
    assert math.log(MAX_WALL_S) < 700.0 / 1.0  # and that is past a century


def test_every_rate_zero_is_an_mtti_of_none(tmp_path, capsys):
    code, out, err = goodput(tmp_path, capsys, NO_FAILURES, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["mtti_s"] is None and result["interruptions"] == 0.0
    code, out, err = goodput(tmp_path, capsys, NO_FAILURES)
    assert code == 0, err
    assert "  MTTI                none: every failure rate is 0\n" in out
    assert "inf" not in out


@pytest.mark.parametrize(("spares", "repair", "rate"), [(1, "29d", 0.01), (16, "30d", 0.1),
                                                         (4, "1d", 0.5)])
def test_a_spare_pool_that_failures_drain_is_refused(tmp_path, capsys, spares, repair, rate):
    reliability = (f'spare_nodes = {spares}\nrepair = "{repair}"\n'
                   f"[reliability.rates]\ngpu = {rate}\n")
    refused(goodput(tmp_path, capsys, reliability),
            f"reliability.spare_nodes: {spares:,} spare nodes, but hardware failures")


def test_littles_law_bound_is_the_pools_size():
    causes = (Cause("gpu", 1 / 3600, 60.0, True), Cause("software", 1.0, 60.0, False))
    check_spares(causes, 2, 2 * 3600 - 1)  # 1.9997 nodes in repair: the pool keeps up
    with pytest.raises(ConfigError, match="keep 2.0 nodes in repair"):
        check_spares(causes, 2, 2 * 3600)
    check_spares(causes, 0, 1e9)  # no pool: each failure waits for its own repair


def test_the_monte_carlo_stops_at_its_draw_budget(monkeypatch):
    monkeypatch.setattr(montecarlo, "MAX_DRAWS", 100_000)
    m = RunModel(useful_s=1e9, work_s=1e9, interval_s=100.0, stall_s=1.0, drain_s=0.0,
                 causes=(Cause("gpu", 1.0, 0.5, False),), spare_nodes=0, repair_s=0.0)
    with pytest.raises(ConfigError, match="drew 100,000 failure times without finishing"):
        simulate_run(m, runs=1, seed=0)


def test_kept_checkpoint_marks_are_those_counted_one_by_one():
    m = RunModel(useful_s=5e6, work_s=5e6, interval_s=100.0, stall_s=1.0, drain_s=0.0,
                 causes=(Cause("gpu", 1e-5, 50.0, False),), spare_nodes=0, repair_s=0.0)
    trace = simulate_run(m, runs=1, seed=3).trajectory
    assert trace.checkpoint_every == math.ceil(50_000 / montecarlo.MAX_MARKS)
    # between failures the kept marks are one every `checkpoint_every` cycles
    gaps = {round(b - a, 6) for a, b in zip(trace.checkpoints, trace.checkpoints[1:])}
    assert round(trace.checkpoint_every * 101.0, 6) in gaps
    assert len(trace.checkpoints) <= montecarlo.MAX_MARKS + len(trace.failures) + 1
