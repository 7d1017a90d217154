"""Stragglers over a run: the slow nodes' share of the simulated step, their cost over the run
in closed form, and the eviction that pays when one restart costs less."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.config import load_experiment
from sim.goodput.plan import plan_run
from sim.simulate import predict
from tests.sim.commands.test_simulate_cli import SMALL

DAY = 86_400.0


def plan(tmp_path, variability: str, days: float = 20.0):
    p = tmp_path / "s.toml"
    p.write_text(SMALL + variability + "\n[reliability]\nruns = 5\n")
    exp = load_experiment(p)
    summary, _ = predict(exp)
    return summary, plan_run(exp, summary, target=days * DAY * summary.tokens_per_s)


def test_slow_nodes_alone_cost_the_whole_variability(tmp_path):
    summary, p = plan(tmp_path, "slow_nodes = 0.2\nslow_factor = 1.5\n")
    s = p.stragglers
    assert s is not None and summary.variability_s > 0
    assert s.slow_step_s == summary.variability_s  # no jitter: all of it is the slow nodes'
    assert s.slow_nodes_expected == pytest.approx(2 * 0.2)
    assert s.steps == pytest.approx(20 * DAY / summary.step_time_s)
    assert s.keep_s == pytest.approx(summary.variability_s * 20 * DAY / summary.step_time_s)
    assert s.keep_gpu_hours == pytest.approx(s.keep_s * 16 / 3600)
    assert s.evict_s == p.restart.seconds(waits_for_repair=False)
    assert s.evict and s.saved_s == pytest.approx(s.keep_s - s.evict_s)
    assert p.variability_s == summary.variability_s  # time-to-train runs at the stretched step


def test_the_slow_share_matches_a_step_simulated_without_slow_nodes(tmp_path):
    # the proportional split against an independent path: the step simulated with the same
    # jitter and no slow nodes
    both, p = plan(tmp_path, "jitter = 0.05\nslow_nodes = 0.2\nslow_factor = 1.5\n")
    jitter_only, _ = plan(tmp_path, "jitter = 0.05\n")
    assert p.stragglers is not None
    simulated = both.variability_s - jitter_only.variability_s
    assert p.stragglers.slow_step_s == pytest.approx(simulated, rel=1e-3)


def test_a_short_run_keeps_its_stragglers(tmp_path):
    _, p = plan(tmp_path, "slow_nodes = 0.2\nslow_factor = 1.05\n", days=0.001)
    s = p.stragglers
    assert s is not None and s.keep_s < s.evict_s
    assert not s.evict and s.saved_s == 0.0


def test_no_slow_nodes_is_null_in_json(tmp_path, capsys):
    p = tmp_path / "n.toml"
    p.write_text(SMALL + "jitter = 0.02\n[reliability]\nruns = 3\n")
    assert main(["goodput", str(p), "--days", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stragglers"] is None
