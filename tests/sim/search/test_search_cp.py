"""Context parallelism in the search: cp in the default space for long sequences, the rule of
thumb's CP step right after TP (the seeds' TP → CP → PP → DP), CP layouts estimated."""

from __future__ import annotations

import pytest

from sim.search.problem import context, problem_from_dict
from sim.search.rule import rule_of_thumb
from sim.search.run import simulate_one
from sim.search.space import default_values
from traces.layout import Layout
from traces.model import ModelSpec

GiB = 2**30
# An 8B-class decoder at 64K tokens on two DGX H100 (16 GPUs): one sequence's activations
# do not fit in 80 GB at TP 8 without CP, whatever the pipeline depth.
LONG = {
    "model": {"layers": 32, "hidden": 4096, "heads": 32, "seq_len": 65536, "vocab": 32000,
              "attention": "flash"},
    "parallel": {"global_batch": 8},
    "search": {"pp": [1, 2, 4], "vp": [1], "micro_batch": [1], "zero": [0, 1],
               "sp": [True], "recompute": ["none"], "schedule": ["1f1b"]},
    "cluster": {"preset": "dgx-h100", "nodes": 2},
}


def test_cp_joins_the_default_space_only_for_long_sequences():
    short = ModelSpec(layers=2, hidden=64, heads=4, seq_len=2048, vocab=64)
    long = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32768, vocab=64)
    assert default_values(short, 8)["cp"] == (1,)
    assert default_values(long, 8)["cp"] == (1, 2, 4, 8)  # 32K / 8 = 4K tokens a rank
    assert default_values(long, 4)["cp"] == (1, 2, 4)


def test_the_rule_of_thumb_adds_cp_after_tp_until_the_activations_fit():
    ctx = context(problem_from_dict(LONG))
    found = rule_of_thumb(ctx)
    assert found is not None
    layout, fits = found
    assert fits and layout.tp == 8 and layout.cp > 1
    assert layout.tp * layout.cp * layout.pp * layout.dp == 16
    # with half the CP degree no pipeline depth fits (activations do not shrink with pp)
    for pp in (1, 2):
        smaller = Layout(**{**layout.to_dict(), "cp": layout.cp // 2, "pp": pp,
                            "dp": 16 // (8 * layout.cp // 2 * pp)})
        assert ctx.analytic.peak_memory(smaller) > 80 * GiB


def test_a_cp_layout_is_estimated_and_holds_less_memory_than_dp():
    ctx = context(problem_from_dict(LONG))
    with_cp = ctx.analytic.estimate(Layout(tp=8, cp=2, sp=True, global_batch=8))
    # the same GPUs as DP instead: each holds a whole sequence
    without = ctx.analytic.estimate(Layout(tp=8, dp=2, sp=True, global_batch=8))
    assert with_cp.step_time_s > 0 and without.step_time_s > 0
    assert with_cp.peak_memory_bytes < without.peak_memory_bytes


@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_the_analytic_tier_agrees_with_the_simulation_on_a_cp_layout(comm):
    """The ring's exposed messages (p2p) and the inline gathers (all_gather) in closed form,
    against the full simulation of the same layout (measured: within 2%)."""
    problem = problem_from_dict(LONG)
    layout = Layout(tp=8, cp=2, sp=True, global_batch=8, cp_comm=comm)
    estimate = context(problem).analytic.estimate(layout).step_time_s
    simulated = simulate_one(problem, layout).step_time_s
    assert estimate == pytest.approx(simulated, rel=0.05)
