"""zb1p on gloo: the backward really split (a weight GEMM's B computes its input gradients and
keeps the graph, its W the weight gradients later, `executor.tape.phase_backward`), each
layout training as the single-process reference with its plan's calls and nothing else."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from tests.executor.test_interpreter import _check, _world
from tests.executor.workers import Case

ZB = dict(schedule="zb1p")
WORLD2 = {
    "pp2": Case(dict(ZB, pp=2, global_batch=4)),
    "pp2-m3": Case(dict(ZB, pp=2, global_batch=3)),
    "pp2-vp2": Case(dict(ZB, pp=2, vp=2, global_batch=4), model=dict(layers=4)),
    "pp2-full-recompute": Case(dict(ZB, pp=2, global_batch=4, recompute="full")),
    # zbv: rank 0 runs stages 0 and 3 (the embedding and the loss), rank 1 stages 1 and 2
    "zbv-pp2": Case(dict(schedule="zbv", pp=2, vp=2, global_batch=4), model=dict(layers=4)),
    "zbv-pp2-m2": Case(dict(schedule="zbv", pp=2, vp=2, global_batch=2), model=dict(layers=4)),
}
WORLD4 = {
    "tp2-sp-pp2": Case(dict(ZB, tp=2, sp=True, pp=2, global_batch=4)),
    "dp2-pp2": Case(dict(ZB, dp=2, pp=2, global_batch=8, bucket_bytes=20_000)),
}


@pytest.fixture(scope="module")
def world2() -> dict[str, list]:
    return _world(WORLD2, 2)


@pytest.fixture(scope="module")
def world4() -> dict[str, list]:
    return _world(WORLD4, 4)


@pytest.mark.parametrize("name", list(WORLD2))
def test_zb1p_trains_as_the_reference(world2: dict, name: str) -> None:
    _check(WORLD2[name], world2[name])


@pytest.mark.parametrize("name", list(WORLD4))
def test_zb1p_with_tp_sp_and_dp_trains_as_the_reference(world4: dict, name: str) -> None:
    _check(WORLD4[name], world4[name])
