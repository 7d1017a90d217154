"""dualpipe on gloo: deepseek-ai/DualPipe's two copies (rank r holds stage r of one and
pp - 1 - r of the other), micro-batches both ways, each stage's gradient summed over its pair
and DP; it trains as the single-process reference with its plan's calls and nothing else."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.reference import train
from tests.executor.checks import check_training
from tests.executor.test_interpreter import _check, _world
from tests.executor.test_moe import MOE
from tests.executor.workers import ADAMW, OPTIONS, Case

WORLD2 = {
    # rank 0 runs stage 0 of copy 0 (the embedding) and stage 1 of copy 1 (the loss); rank 1
    # the other two: every message crosses the middle pair
    "pp2-m4": Case(dict(schedule="dualpipe", pp=2, global_batch=4), model=dict(layers=4)),
    "pp2-m6": Case(dict(schedule="dualpipe", pp=2, global_batch=6), model=dict(layers=2)),
}


WORLD4 = {
    # rank r: stages r and 3 - r; the middle pair 1, 2 sends both ways
    "pp4-m8": Case(dict(schedule="dualpipe", pp=4, global_batch=8), model=dict(layers=4)),
    # each stage's gradient summed over the pair (0, 1) x DP 2, ZeRO-1 sharded over those 4
    "pp2-dp2-zero1": Case(dict(schedule="dualpipe", pp=2, dp=2, zero=1, global_batch=8),
                          model=dict(layers=4, tied_embeddings=False)),
}
MOE4 = {
    # experts: their gradients over the pair x expert-DP; pairs overlapped, all-to-alls apart
    "pp2-dp2-ep2-overlap": Case(dict(schedule="dualpipe", pp=2, dp=2, ep=2, global_batch=8,
                                     overlap_moe_comm=True), model=dict(MOE, layers=4)),
}


@pytest.fixture(scope="module")
def world2() -> dict[str, list]:
    return _world(WORLD2, 2)


@pytest.fixture(scope="module")
def world4() -> dict[str, list]:
    return _world({**WORLD4, **MOE4}, 4)


@pytest.mark.parametrize("name", list(WORLD2))
def test_dualpipe_trains_as_the_reference(world2: dict, name: str) -> None:
    _check(WORLD2[name], world2[name])


@pytest.mark.parametrize("name", list(WORLD4))
def test_dualpipe_on_four_ranks_trains_as_the_reference(world4: dict, name: str) -> None:
    _check(WORLD4[name], world4[name])


@pytest.mark.parametrize("name", list(MOE4))
def test_dualpipe_with_experts_trains_as_the_reference(world4: dict, name: str) -> None:
    """The MoE reference routes by the layout's ranks (`executor.reference`)."""
    model, layout = MOE4[name].specs()
    run = train(model, layout.global_batch, MOE4[name].steps, OPTIONS.seed, ADAMW,
                layout=layout)
    assert check_training(model, layout, world4[name], run)["param"] <= 1e-6


def test_the_clipped_norm_counts_each_stage_once(world2: dict, world4: dict) -> None:
    """The global gradient norm (clip_grad 1.0) is the reference's: a stage's gradient, held
    summed on both ranks of its pair, counts once."""
    for cases, world in ((WORLD2, world2), (WORLD4, world4)):
        for name, case in cases.items():
            model, layout = case.specs()
            run = train(model, layout.global_batch, case.steps, OPTIONS.seed, ADAMW)
            for res in world[name]:
                assert res["grad_norm"] == pytest.approx(run.grad_norms[-1], rel=1e-5), name
