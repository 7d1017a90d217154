"""`parasim search` end to end on a 1.3B GPT on 16 A100s: the two tiers find what simulating
every candidate finds, pruning is exactly the layout's rules and the memory model, and the answer
does not depend on the engine or the worker count."""

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.cli import main
from sim.models.memory import memory_by_pp_rank
from sim.search.engines import open_engine
from sim.search.output import result_text
from sim.search.problem import context, problem_from_dict
from sim.search.run import search, simulate_one
from sim.search.space import MEMORY_REASON, describe, layout_key
from tests.child import sigint_default
from tests.sim.search.search_cases import SMALL, SMALL_TOML
from traces.errors import ConfigError
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec

GiB = 2**30


@pytest.fixture(scope="module")
def problem():
    return problem_from_dict(SMALL, name="small")


@pytest.fixture(scope="module")
def result(problem):
    with open_engine(workers=1) as engine:
        return search(problem, engine=engine, top_k=12)


@pytest.fixture(scope="module")
def independent():
    """Every candidate judged by hand: the layout's own rules, then `memory_by_pp_rank`."""
    model = ModelSpec(**SMALL["model"])
    search_table = SMALL["search"]
    keys = list(search_table)
    valid, fits, invalid = [], [], 0
    for combo in itertools.product(*search_table.values()):
        values = dict(zip(keys, combo))
        values["dp"] = max(1, 16 // (values["tp"] * values["pp"]))
        try:
            layout = Layout(global_batch=16, **values)
            check_layout(model, layout, world=16, devices_per_server=8)
        except ConfigError:
            invalid += 1
            continue
        valid.append(layout)
        peak = max(m.total_bytes for m in memory_by_pp_rank(model, layout))
        if peak <= 16 * GiB:
            fits.append(layout)
    return {"valid": valid, "fits": fits, "invalid": invalid}


def test_pruned_are_exactly_what_the_rules_and_the_memory_model_reject(result, independent):
    assert result.num_candidates == 144
    assert {r.layout for r in result.feasible} == set(independent["fits"])
    assert {lay for lay, _ in result.infeasible} == \
        set(independent["valid"]) - set(independent["fits"])
    assert result.pruned[MEMORY_REASON] == len(independent["valid"]) - len(independent["fits"])
    assert sum(n for reason, n in result.pruned.items() if reason != MEMORY_REASON) == \
        independent["invalid"]
    assert len(result.infeasible) > 0 and independent["invalid"] > 0  # both kinds happen


@pytest.mark.slow
def test_the_best_is_the_best_of_simulating_every_candidate(problem, result):
    feasible = [r.layout for r in result.feasible]
    assert result.top_k <= len(feasible) / 10
    with open_engine(workers=2) as engine:  # one by one, two at a time
        runs = engine.map(simulate_one, problem, feasible)
    every = sorted(((run.step_time_s, layout_key(lay), lay) for run, lay in zip(runs, feasible)),
                   key=lambda t: t[:2])
    assert result.best.layout == every[0][2]
    assert result.best.simulated.step_time_s == every[0][0]
    # The simulated top K is in simulated order, and each is the full simulation's figure.
    times = [r.simulated.step_time_s for r in result.simulated]
    assert times == sorted(times)
    assert result.kendall_tau is not None and -1 <= result.kendall_tau <= 1


def test_analytic_order_and_ranks(result):
    steps = [(r.estimate.step_time_s, layout_key(r.layout)) for r in result.feasible]
    assert steps == sorted(steps)
    assert [r.analytic_rank for r in result.feasible] == list(range(1, len(steps) + 1))
    assert {r.analytic_rank for r in result.simulated} == set(range(1, result.top_k + 1))


def test_rule_of_thumb_fills_a_node_then_pipelines_until_it_fits(result):
    rule = result.rule
    assert rule is not None and result.rule_fits and rule.simulated is not None
    lay = rule.layout
    assert (lay.tp, lay.micro_batch, lay.zero, str(lay.recompute)) == (8, 1, 0, "none")
    # The smallest pipeline that fits: one stage fewer would not.
    ctx = context(problem_from_dict(SMALL))
    assert ctx.analytic.peak_memory(lay) <= 16 * GiB
    if lay.pp > 1:
        smaller = Layout(**{**lay.to_dict(), "pp": lay.pp // 2, "dp": lay.dp * 2})
        assert ctx.analytic.peak_memory(smaller) > 16 * GiB


def run_json(capsys, path, *flags):
    code = main(["search", str(path), "--json", "--top", "3", *flags])
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    return out


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL_TOML)
    return path


def test_search_json_carries_provenance(capsys, config):
    import hashlib

    assert main(["search", str(config), "--json", "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out)[-1] == "parasim"
    assert out["parasim"]["config_sha256"] == hashlib.sha256(config.read_bytes()).hexdigest()
    assert out["parasim"]["profile"]["calibrated"] is False


def test_one_or_two_workers_give_byte_identical_json(capsys, config):
    one = run_json(capsys, config, "--workers", "1")
    two = run_json(capsys, config, "--workers", "2")
    assert one == two
    data = json.loads(one)
    assert data["candidates"] == 144 and data["top_k"] == 3
    assert [row["rank"] for row in data["simulated"]] == [1, 2, 3]
    assert data["best"] == data["simulated"][0]
    assert data["rule_of_thumb"]["summary"].startswith("tp8 ")
    assert sum(data["pruned"].values()) == data["candidates"] - data["fit"]


@pytest.mark.slow
def test_ray_gives_the_same_json(capsys, config):
    ray = pytest.importorskip("ray")
    local = run_json(capsys, config, "--workers", "2")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    capsys.readouterr()  # Ray's own start-up lines
    try:
        on_ray = run_json(capsys, config, "--ray", "auto")
    finally:
        ray.shutdown()
    assert on_ray == local


def test_without_ray_installed_the_flag_is_one_line(capsys, config, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    code = main(["search", str(config), "--ray", "auto"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == "parasim: error: --ray: Ray is not installed; pip install 'parasim[ray]'\n"


def test_text_and_report(capsys, config, tmp_path):
    report = tmp_path / "search.html"
    code = main(["search", str(config), "--top", "2", "--workers", "1", "--report", str(report)])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert "144 candidates" in out and "Kendall tau" in out and "rule of thumb  tp8 " in out
    assert out.splitlines()[0].endswith("(16 GPUs)")
    rule = next(line for line in out.splitlines() if line.startswith("  rule of thumb"))
    assert rule.endswith("slower than the best") and " among the simulated, " in rule
    lines = [line for line in out.splitlines() if line.startswith(("    1  ", "    2  "))]
    assert len(lines) == 2
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and 'id="parasim-search"' in page
    assert "simulated top 2" in page and "GPU memory" in page
    assert not math.isnan(float(lines[0].split()[-2]))  # the analytic time column


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_ctrl_c_exits_130_at_once_and_leaves_no_report(tmp_path):
    """Ctrl-C reaches the command and its workers (one process group): exit 130, one line,
    no report, no worker left running a queued simulation."""
    report = tmp_path / "r.html"
    proc = subprocess.Popen([sys.executable, "-m", "sim", "search", "--workers", "2",
                             "--report", str(report)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=sigint_default)
    # Once it has started its worker processes the search is under way (the GPT-3 search then
    # runs for a minute); on Linux a process lists its children in /proc.
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 60
    while not (children.exists() and children.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, "the search never started"
        time.sleep(0.1)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and out == ""
    assert err == "parasim: error: interrupted\n"
    assert not report.exists() and not list(tmp_path.glob(".parasim-*"))


def test_the_rule_of_thumb_line_gives_its_rank_among_the_simulated(result):
    """Its simulated time placed among the simulated top K by hand: 1 + how many of them are
    faster, and how much slower than the best it is."""
    rule = result.rule
    t = rule.simulated.step_time_s
    faster = sum(1 for c in result.simulated
                 if c.simulated.step_time_s < t and c.layout != rule.layout)
    slower = t / result.best.simulated.step_time_s - 1
    line = next(x for x in result_text(result).splitlines()
                if x.startswith("  rule of thumb"))
    where = (f"analytic rank {rule.analytic_rank:,} of {len(result.feasible):,}"
             if rule.analytic_rank else "outside the searched space")
    assert line == (f"  rule of thumb  {describe(rule.layout)}: {where}; simulated {t:.3f} s, "
                    f"rank {1 + faster} among the simulated, "
                    + (f"{slower:.1%} slower than the best" if slower > 0 else "the best"))
    assert faster > 0 and slower > 0  # on this space the rule is not the best
