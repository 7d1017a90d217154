"""FSDP2's reshard_after_forward and grad_sync run for real (traces.fsdp): ZeRO 2 and 3 with
gradients reduced once per step, ZeRO-3 holding its gathered units from forward to backward
(and under a pipeline across the step) train as the single-process reference, each rank's
communication is its plan's, and the measured trace holds together (test_interpreter's
checks)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from tests.executor.test_interpreter import _check, _world
from tests.executor.workers import Case

pytestmark = pytest.mark.slow  # two gloo worlds of a few cases: tens of seconds on 2 cores

WORLD2 = {
    "zero2-step": Case(dict(dp=2, zero=2, global_batch=4, bucket_bytes=20_000,
                            grad_sync="step")),
    "zero3-step": Case(dict(dp=2, zero=3, global_batch=4, grad_sync="step")),
    "zero3-no-reshard": Case(dict(dp=2, zero=3, global_batch=4, reshard_after_forward=False)),
    # all forwards first: the backwards after the first find their units freed and re-gather
    "zero3-no-reshard-step-gpipe-full": Case(dict(dp=2, zero=3, global_batch=6,
                                                  schedule="gpipe", recompute="full",
                                                  reshard_after_forward=False,
                                                  grad_sync="step")),
}
WORLD4 = {
    # torchtitan's FSDP2 under PP: gathered once per step, reduce-scattered once per step
    "pp2-zero3-no-reshard-step": Case(dict(pp=2, dp=2, zero=3, global_batch=8,
                                           reshard_after_forward=False, grad_sync="step"),
                                      model=dict(tied_embeddings=False)),
    "pp2-zero3-no-reshard": Case(dict(pp=2, dp=2, zero=3, global_batch=8,
                                      reshard_after_forward=False),
                                 model=dict(tied_embeddings=False)),
    # SP's replicated gradients summed over TP once, before the step's one reduce-scatter
    "tp2-sp-zero3-step": Case(dict(tp=2, dp=2, sp=True, zero=3, global_batch=4,
                                   grad_sync="step")),
    "pp2-zero2-step": Case(dict(pp=2, dp=2, zero=2, global_batch=8, bucket_bytes=20_000,
                                grad_sync="step"), model=dict(tied_embeddings=False)),
}


@pytest.fixture(scope="module")
def world2() -> dict[str, list]:
    return _world(WORLD2, 2)


@pytest.fixture(scope="module")
def world4() -> dict[str, list]:
    return _world(WORLD4, 4)


@pytest.mark.parametrize("name", list(WORLD2))
def test_two_ranks_train_as_the_reference(world2: dict, name: str) -> None:
    _check(WORLD2[name], world2[name])


@pytest.mark.parametrize("name", list(WORLD4))
def test_pipeline_and_fsdp_train_as_the_reference(world4: dict, name: str) -> None:
    _check(WORLD4[name], world4[name])
