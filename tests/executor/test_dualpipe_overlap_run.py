"""DualPipe's overlapped pairs in the executor (issue 33): under dualpipev with
overlap_moe_comm each pair (a forward, the other chunk's B and W) runs merged, its EP
all-to-alls asynchronous on gloo; training equals the single-process reference and every
call is the plan's."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.consistency import problems
from executor.recorder import timed_trace
from executor.reference import train
from tests.executor.checks import check_training
from tests.executor.plan_match import call_sequences, plan_sequences
from tests.executor.test_interpreter import _world
from tests.executor.test_moe import MOE
from tests.executor.workers import ADAMW, OPTIONS, Case
from traces.moe_overlap import groups
from traces.ops import Stream
from traces.pipeline import layout_schedule
from traces.plan import build
from traces.purpose import ExpertAllToAll

WORLD4 = {
    # rank 0 of the pipeline runs stages 0 and 3, rank 1 stages 1 and 2; 4 micro-batches
    "dualpipev-pp2-dp2-ep2": Case(dict(schedule="dualpipev", pp=2, vp=2, dp=2, ep=2,
                                       global_batch=8, overlap_moe_comm=True),
                                  model=dict(MOE, layers=4)),
}


@pytest.fixture(scope="module")
def world4() -> dict[str, list]:
    return _world(WORLD4, 4)


@pytest.mark.parametrize("name", list(WORLD4))
def test_dualpipev_pairs_train_as_the_reference(world4: dict, name: str) -> None:
    model, layout = WORLD4[name].specs()
    plan = build(model, layout)
    schedule = layout_schedule(layout)
    for rank, ops in plan.ops.items():  # each rank overlaps pairs, its all-to-alls apart
        assert groups(layout.schedule, schedule[layout.coords(rank).pp]), rank
        moved = [op for op in ops if isinstance(op.purpose, ExpertAllToAll)]
        assert moved and all(op.stream == Stream.EP_COMM for op in moved)
    run = train(model, layout.global_batch, WORLD4[name].steps, OPTIONS.seed, ADAMW,
                layout=layout)
    results = world4[name]
    worst = check_training(model, layout, results, run)
    assert worst["param"] <= 1e-6
    trace = timed_trace(plan, {r: res["records"] for r, res in enumerate(results)}, plan.meta)
    assert trace.meta.complete is True
    assert problems(trace, plan=plan) == []
    for rank, res in enumerate(results):
        assert call_sequences(res["calls"]) == plan_sequences(plan.ops[rank], rank)
