"""Four and eight gloo ranks: tensor, pipeline and data parallelism together train as the
single-process reference (the issue's 3D mix: TP 2 x PP 2 x DP 2 on 8 ranks)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.launch import spawn
from executor.reference import train
from tests.executor.checks import check_training
from tests.executor.plan_match import call_sequences, plan_sequences
from tests.executor.workers import ADAMW, LLAMA, OPTIONS, Case, train_cases
from traces.plan import build

TIMEOUT_S = 60
WORLD4 = {
    "tp2-dp2-sp-zero1": Case(dict(tp=2, dp=2, sp=True, zero=1, global_batch=4,
                                  schedule="gpipe", bucket_bytes=10_000), record=True),
    "pp2-dp2-zero2-untied": Case(dict(pp=2, dp=2, zero=2, global_batch=4, schedule="gpipe",
                                      bucket_bytes=10_000),
                                 model=dict(tied_embeddings=False), record=True),
    # Without SP, pipeline messages travel as TP chunks, all-gathered after each receive.
    "tp2-pp2-full": Case(dict(tp=2, pp=2, global_batch=4, schedule="gpipe", recompute="full"),
                         record=True),
    "llama-tp2-dp2-sp-zero1": Case(dict(tp=2, dp=2, sp=True, zero=1, global_batch=4,
                                        schedule="gpipe", bucket_bytes=10_000),
                                   model=LLAMA, record=True),
}
WORLD8 = {
    "tp2-pp2-dp2-sp": Case(dict(tp=2, pp=2, dp=2, sp=True, global_batch=4, schedule="gpipe",
                                bucket_bytes=10_000), record=True),
}


def _world(cases: dict[str, Case], size: int) -> dict[str, list]:
    results, _ = spawn(train_cases, size, (list(cases.values()),), timeout_s=TIMEOUT_S)
    return {name: list(per_rank) for name, per_rank in zip(cases, zip(*results))}


@pytest.fixture(scope="module")
def world4() -> dict[str, list]:
    return _world(WORLD4, 4)


@pytest.fixture(scope="module")
def world8() -> dict[str, list]:
    return _world(WORLD8, 8)


def _check(case: Case, results: list) -> None:
    model, layout = case.specs()
    check_training(model, layout, list(results),
                   train(model, layout.global_batch, case.steps, OPTIONS.seed, ADAMW))
    plan = build(model, layout)
    for rank, result in enumerate(results):
        per_step = result["calls"][:len(result["calls"]) // case.steps]
        assert call_sequences(per_step) == plan_sequences(plan.ops[rank]), f"rank {rank}"


@pytest.mark.parametrize("name", list(WORLD4))
def test_four_ranks(world4: dict, name: str) -> None:
    _check(WORLD4[name], world4[name])


@pytest.mark.parametrize("name", list(WORLD8))
def test_eight_ranks(world8: dict, name: str) -> None:
    _check(WORLD8[name], world8[name])
