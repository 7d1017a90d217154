"""The analytic tier on Megatron-Core's pipeline splits where a rank's chunks differ (account
flags with vp > 1, pipeline layouts): each rank's own chunks, checked against the plan, the
memory model and the simulation."""

from __future__ import annotations

import pytest

from sim.models.memory import memory_by_pp_rank
from sim.search.analytic import Analytic
from sim.search.passes import gradient_buckets
from sim.search.rank_work import _by_stage, _equal, equal_chunks
from sim.search.stage_time import UnitTime
from tests.sim.search.test_search_analytic import MODEL, both, busiest_compute_s, experiment
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Stream
from traces.plan import build

INTERLEAVED = {"pp": 2, "vp": 2, "dp": 4, "schedule": "interleaved", "global_batch": 32}
SPLITS = [
    ({**INTERLEAVED, "account_for_embedding": True, "account_for_loss": True}, 6),  # 1 2 2 1
    ({**INTERLEAVED, "account_for_embedding": True}, 7),                          # 1 2 2 2
    ({**INTERLEAVED, "pipeline_layout": "E|ttt|ttt|L"}, 6),                       # 0 3 3 0
    ({**INTERLEAVED, "tp": 2, "dp": 2, "pipeline_layout": "Et|tt|t|L"}, 4),       # 1 2 1 0
]


@pytest.mark.parametrize(("parallel", "layers"), SPLITS, ids=str)
def test_compute_is_the_plans_kernels_stage_by_stage(parallel, layers):
    """The busiest rank's kernels: the full plan's compute ops timed by the compute model."""
    exp = experiment(parallel, layers=layers)
    layout = exp.layout
    assert not equal_chunks(exp.model, layout)
    estimate = Analytic(exp.model, exp.cluster, exp.profile).estimate(layout)
    assert estimate.compute_s == pytest.approx(busiest_compute_s(exp), rel=1e-12)


@pytest.mark.parametrize(("parallel", "layers"), SPLITS, ids=str)
def test_the_estimate_stays_close_to_the_simulation(parallel, layers):
    """Within 6%: the estimate has no interference, and on the last split the last stage's
    logits and cross-entropy run beside its communication (1.3 ms of 37.7 ms slower)."""
    estimate, summary = both(experiment(parallel, layers=layers))
    assert estimate.step_time_s == pytest.approx(summary.step_time_s, rel=0.06)
    assert estimate.peak_memory_bytes == summary.peak_memory_bytes


@pytest.mark.parametrize(("parallel", "layers"), SPLITS, ids=str)
def test_memory_and_buckets_are_the_models_and_the_plans(parallel, layers):
    exp = experiment(parallel, layers=layers)
    model, layout = exp.model, exp.layout
    analytic = Analytic(model, exp.cluster, exp.profile)
    expected = memory_by_pp_rank(model, layout)
    assert analytic.memory(layout) == expected
    assert analytic.peak_memory(layout) == max(m.total_bytes for m in expected)
    plan = build(model, layout, ranks=layout.representatives())
    for r in range(layout.pp):
        sizes = [op.size_bytes for op in plan.ops[layout.rank(pp=r)] if op.stream == Stream.DP
                 and op.name == "grads" and op.microbatch == layout.num_microbatches - 1]
        assert gradient_buckets(model, layout, r) == sizes


UNIT = UnitTime(compute_fwd=3.0, side_fwd=0.5, compute_bwd=6.0, side_bwd=1.0, kernels=8.0,
                tail=0.25, beside_fwd=3.5, beside_bwd=7.0)
EMBED = UnitTime(compute_fwd=1.0, side_fwd=0.0, compute_bwd=1.5, side_bwd=0.0, kernels=2.5,
                 tail=0.5, beside_fwd=1.0, beside_bwd=1.5)
HEAD = UnitTime(compute_fwd=2.0, side_fwd=0.0, compute_bwd=3.0, side_bwd=0.0, kernels=5.0,
                tail=0.0, beside_fwd=2.0, beside_bwd=3.0)


@pytest.mark.parametrize("layout", [
    Layout(pp=4, vp=2, schedule="interleaved", global_batch=8),
    Layout(pp=2, vp=3, schedule="interleaved", global_batch=8),
    Layout(pp=4, global_batch=8, pp_first_layers=2, pp_last_layers=2),
])
def test_stage_by_stage_equals_the_closed_form_where_chunks_are_equal(layout):
    """Two paths: vp - 1 own chunks plus the end chunk, and every chunk added up."""
    model = ModelSpec(**{**MODEL, "layers": 12})
    closed, summed = (f(model, layout, UNIT, EMBED, HEAD, 0.125) for f in (_equal, _by_stage))
    assert summed.chunk == closed.chunk
    for r, work in closed.ranks.items():
        got = summed.ranks[r]
        assert got.per_microbatch == pytest.approx(work.per_microbatch, rel=1e-12)
        assert got.last_backward == pytest.approx(work.last_backward, rel=1e-12)
        assert got.kernels == pytest.approx(work.kernels, rel=1e-12)
    assert summed.ranks[0].tail == closed.ranks[0].tail  # the embedding's, on rank 0
