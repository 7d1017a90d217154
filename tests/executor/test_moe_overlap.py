"""overlap_moe_comm in the executor (issue 33, item 2): the EP all-to-alls issued
asynchronously on gloo on their own stream, each paired forward and backward run merged in
Megatron-Core's per-layer order; training equals the single-process reference, with no
pipeline (1F1B's pairs of a backward and the next forward) and under interleaving (one more
warm-up forward), and every call is the plan's."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.consistency import problems
from executor.launch import spawn
from executor.recorder import timed_trace
from executor.reference import train
from tests.executor.checks import check_training
from tests.executor.plan_match import call_sequences, plan_sequences
from tests.executor.test_moe import MOE, SKEW
from tests.executor.workers import ADAMW, OPTIONS, Case, interpret_cases
from traces.moe_overlap import pairs
from traces.ops import Stream
from traces.pipeline import layout_schedule
from traces.plan import build
from traces.purpose import ExpertAllToAll

TIMEOUT_S = 120
ON = dict(overlap_moe_comm=True)
WORLD2 = {
    # no pipeline: 4 micro-batches, B(i) merged with F(i + 1)
    "ep2-dp2-4mb": Case(dict(ep=2, dp=2, global_batch=8, **ON), model=MOE),
    "ep2-dp2-4mb-skew": Case(dict(ep=2, dp=2, global_batch=8, **ON), model=SKEW),
}
WORLD4 = {
    # interleaved: 2 stages x 2 chunks, 4 MoE layers of 5, 4 micro-batches
    "ep2-pp2-vp2-dp2-skew": Case(dict(pp=2, vp=2, schedule="interleaved", dp=2, ep=2,
                                      global_batch=8, **ON),
                                 model=dict(SKEW, layers=4)),
}
CASES = {**WORLD2, **WORLD4}


@pytest.fixture(scope="module")
def worlds() -> dict[str, list]:
    out = {}
    for cases, size in ((WORLD2, 2), (WORLD4, 4)):
        results, _ = spawn(interpret_cases, size, (list(cases.values()), False),
                           timeout_s=TIMEOUT_S)
        out.update({name: list(per_rank) for name, per_rank in zip(cases, zip(*results))})
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_overlapped_training_equals_the_reference(worlds: dict, name: str) -> None:
    model, layout = CASES[name].specs()
    plan = build(model, layout)
    schedule = layout_schedule(layout)
    for rank, ops in plan.ops.items():  # the case overlaps something, on its own stream
        assert pairs(schedule[layout.coords(rank).pp]), rank
        moved = [op for op in ops if isinstance(op.purpose, ExpertAllToAll)]
        assert moved and all(op.stream == Stream.EP_COMM for op in moved)
    run = train(model, layout.global_batch, CASES[name].steps, OPTIONS.seed, ADAMW,
                layout=layout)
    results = worlds[name]
    worst = check_training(model, layout, results, run)
    assert worst["param"] <= 1e-6
    for res in results:
        assert res["grad_norm"] == pytest.approx(run.grad_norms[-1], rel=1e-5)
    trace = timed_trace(plan, {r: res["records"] for r, res in enumerate(results)}, plan.meta)
    assert trace.meta.complete is True
    assert problems(trace, plan=plan) == []
    for rank, res in enumerate(results):
        assert call_sequences(res["calls"]) == plan_sequences(plan.ops[rank], rank)
