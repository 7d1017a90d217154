"""`parasim goodput`'s outputs: the JSON carries every figure the text shows, the badput
categories add up to the wall time, time-to-train is the runs' percentiles, no `inf`, and the
same seed gives byte-identical JSON and HTML."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sim.cli import main
from sim.config import load_experiment
from sim.goodput import badput
from sim.goodput.montecarlo import simulate_run
from sim.goodput.outputs import CHECKPOINT_STALLS, goodput_json
from sim.goodput.plan import plan_run
from sim.goodput.rates import COMPONENT_NAMES
from sim.simulate import predict
from tests.sim.commands.test_simulate_cli import SMALL
from tests.sim.goodput.test_montecarlo import model

RELIABILITY = "\n[reliability]\nspare_nodes = 1\nruns = 40\nsdc_rate = 1e-3\n"


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(SMALL + RELIABILITY)
    return p


def cli(capsys, *argv: object) -> str:
    assert main(["goodput", *map(str, argv)]) == 0
    return capsys.readouterr().out


def test_badput_categories_sum_to_the_mean_wall_time():
    # the wall time is useful work + every badput second, run by run; so in the mean too
    m = model(hardware=True, repair=3600.0, spares=1, drain=30.0, delta=20.0)
    out = simulate_run(m, runs=100, seed=4)
    assert set(out.badput_s) == set(badput.CATEGORIES)
    total = out.useful_s + sum(out.badput_s.values())
    assert total == pytest.approx(float(np.mean(out.wall_times_s)), rel=1e-12)
    # the model's test causes carry no parts: their restarts are OTHER, the waits infra
    assert out.badput_s[badput.OTHER] > 0 and out.badput_s[badput.INFRASTRUCTURE] > 0


def test_restart_parts_land_in_their_categories(path):
    exp = load_experiment(path)
    summary, _ = predict(exp)
    plan = plan_run(exp, summary, target=5 * 86_400 * summary.tokens_per_s)
    out = simulate_run(plan.model, runs=40, seed=0)
    total = out.useful_s + sum(out.badput_s.values())
    assert total == pytest.approx(float(np.mean(out.wall_times_s)), rel=1e-12)
    # the silent-corruption checks are the same in every run: checks x cost
    assert out.badput_s[badput.CUSTOM] == pytest.approx(plan.model.work_s
                                                        - plan.model.useful_s)
    # every completed restart pays its process-group initialisation once (interrupted ones
    # part of it): at most interruptions x pg_init
    pg = plan.restart.pg_init_s
    assert 0 < out.badput_s[badput.INITIALIZATION] <= float(np.mean(out.interruptions)) * pg
    assert out.badput_s[badput.OTHER] == 0.0


def test_time_to_train_is_the_runs_percentiles(path):
    exp = load_experiment(path)
    summary, _ = predict(exp)
    plan = plan_run(exp, summary, target=1e12)
    out = simulate_run(plan.model, runs=40, seed=3)
    data = goodput_json(plan, out)
    p50, p90 = np.percentile(out.wall_times_s, [50, 90])
    assert data["time_to_train"] == {
        "tokens": 1e12, "days": {"p50": p50 / 86_400, "p90": p90 / 86_400},
        "gpu_hours": {"p50": p50 * 16 / 3600, "p90": p90 * 16 / 3600}}
    assert data["wall_time_s"]["p50"] == p50 and data["wall_time_s"]["p90"] == p90


def test_json_carries_the_figures_the_text_shows(capsys, path):
    text = cli(capsys, path, "--days", 10)
    data = json.loads(cli(capsys, path, "--days", 10, "--json"))
    low, high = data["effective_training_fraction_ci95"]
    ttt = data["time_to_train"]
    shown = [
        f"{data['effective_training_fraction']:.2%} simulated (95% CI {low:.2%} to {high:.2%}, "
        f"{data['runs']} runs, seed {data['seed']}); analytic "
        f"{data['analytic_fraction_at_interval']:.2%} at this interval, "
        f"{data['analytic_fraction_at_optimum']:.2%} at the optimum",
        f"{data['step_time_s']:.4g} s, {data['tokens_per_s']:,.0f} tokens/s",
        f"{data['checkpoint_bytes'] / 1e12:.3g} TB",
        f"Daly {data['daly_interval_s']:.3g} s, Young {data['young_interval_s']:.3g} s",
        f"p50 {ttt['days']['p50']:,.2f} d, p90 {ttt['days']['p90']:,.2f} d",
        f"p50 {ttt['gpu_hours']['p50']:,.0f} GPU-hours, p90 {ttt['gpu_hours']['p90']:,.0f}",
        f"interruptions       {data['interruptions']:,.1f} on average",
        f"{data['spare_nodes']} spare nodes",
        f"{data['mtti_s'] / 86_400:.2f} d (fleet {data['fleet']}: "
        + ", ".join(f"{n:,} {c}" for c, n in data["components"].items()),
    ]
    for figure in shown:
        assert figure in text, figure
    for cause, lost in data["lost_gpu_hours_by_cause"].items():
        count = "" if cause == CHECKPOINT_STALLS else \
            f"{data['interruptions_by_cause'][cause]:,.1f}"
        assert f"    {cause:<18}{count:>13}   {lost:>14,.0f}" in text, cause
    for category, seconds in data["badput_s"].items():
        if seconds > 0:
            assert f"    {category:<40}{seconds / 3600:>10,.2f}" in text, category


def test_no_failure_rate_gives_null_with_a_reason_not_inf(capsys, tmp_path):
    p = tmp_path / "c.toml"
    zero = "\n".join(f"{c} = 0" for c in COMPONENT_NAMES)
    p.write_text(SMALL + "\n[reliability]\nruns = 3\n[reliability.rates]\n" + zero + "\n")
    raw = cli(capsys, p, "--days", 2, "--json")
    assert "Infinity" not in raw and "NaN" not in raw
    data = json.loads(raw)
    assert data["mtti_s"] is None and data["daly_interval_s"] is None
    assert "every failure rate is 0" in data["mtti_null_reason"]
    assert data["interruptions"] == 0.0 and math.isfinite(data["expected_wall_s"])


def test_same_seed_byte_identical_json_and_html(capsys, path, tmp_path):
    pages = []
    outs = []
    for name in ("a.html", "b.html"):
        outs.append(cli(capsys, path, "--days", 5, "--json", "--report", tmp_path / name))
        pages.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1] and pages[0] == pages[1]
    cli(capsys, path, "--days", 5, "--seed", 9, "--report", tmp_path / "c.html")
    assert (tmp_path / "c.html").read_bytes() != pages[0]


def gpu_only(mtti_h: float) -> str:
    """One cause, the GPUs' (16 of them), at the rate of a job MTTI of `mtti_h` hours."""
    zero = "\n".join(f"{c} = 0" for c in COMPONENT_NAMES if c != "gpu")
    return f"[reliability.rates]\ngpu = {1 / (16 * mtti_h)!r}\n{zero}\n"


def plan_and_outcome(tmp_path, reliability: str, days: float, runs: int = 20):
    p = tmp_path / "r.toml"
    p.write_text(SMALL + "\n[reliability]\n" + reliability)
    exp = load_experiment(p)
    summary, _ = predict(exp)
    plan = plan_run(exp, summary, target=days * 86_400 * summary.tokens_per_s)
    return plan, simulate_run(plan.model, runs=runs, seed=0)


def test_the_progress_chart_thins_its_markers_at_scale(tmp_path):
    from sim.goodput.report import MAX_CHECKPOINT_MARKS, MAX_FAILURE_MARKS, progress_figure

    plan, out = plan_and_outcome(tmp_path, 'restart = "1min"\n' + gpu_only(0.5), 10,
                                 runs=2)
    failures = len(out.trajectory.failures)
    assert failures > 2 * MAX_FAILURE_MARKS  # ~470 in 10 days: thinning has work to do
    fig = progress_figure(plan, out)
    marks = {t.name: len(t.x) for t in fig.data if t.mode == "markers"}
    shown = sum(n for name, n in marks.items() if name.startswith("failure"))
    assert shown <= MAX_FAILURE_MARKS + 1
    checkpoints = next(n for name, n in marks.items() if name.startswith("checkpoints"))
    assert checkpoints <= MAX_CHECKPOINT_MARKS
    assert f"failure: gpu ({failures:,}, {shown:,} shown)" in marks


def test_every_cause_is_labelled_and_the_histogram_marks_p50_p90(tmp_path):
    from sim.goodput.report import lost_figure, walltime_figure

    plan, out = plan_and_outcome(tmp_path, gpu_only(12), 5)
    bar = lost_figure(plan, out).data[0]
    assert set(bar.y) == {"gpu", "checkpoint stalls"}  # two causes, both labelled
    assert [t.split(":")[0] for t in bar.text] == list(bar.y)
    fig = walltime_figure(plan, out)
    assert list(fig.data[0].x) == (out.wall_times_s / 86_400).tolist()
    p50, p90 = np.percentile(out.wall_times_s / 86_400, [50, 90])
    assert [s.x0 for s in fig.layout.shapes] == [p50, p90]
    assert [a.text for a in fig.layout.annotations] == [f"P50 {p50:,.2f} d",
                                                        f"P90 {p90:,.2f} d"]


def test_the_badput_chart_is_labelled_at_1_2_5_with_every_bar_in_view(tmp_path):
    """Not plotly's minor digits ('2', '5' between 0.1 and 1000); every bar's hours and the
    figure written right of the longest inside the range."""
    from sim.goodput.report import badput_figure
    from sim.report.plotly_page import tick_text

    plan, out = plan_and_outcome(tmp_path, gpu_only(12), 5)
    fig = badput_figure(plan, out)
    hours = [h for h in fig.data[0].x if h > 0]
    axis = fig.layout.xaxis
    assert axis.type == "log" and axis.tickmode == "array"
    lo, hi = axis.range
    assert 10**lo < min(hours) and 2 * max(hours) < 10**hi
    assert axis.tickvals and all(f"{v:.0e}"[0] in "125" and float(f"{v:.0e}") == v
                                 for v in axis.tickvals)
    assert list(axis.ticktext) == [tick_text(v) for v in axis.tickvals]
