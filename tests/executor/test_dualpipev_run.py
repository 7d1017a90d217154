"""dualpipev on gloo: zbv's V with DualPipeV's order (its full backwards as a B and its W at
once, its split ones apart), each layout training as the single-process reference with its
plan's calls and nothing else."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from tests.executor.test_interpreter import _check, _world
from tests.executor.workers import Case

WORLD2 = {
    # rank 0 runs stages 0 and 3 (the embedding and the loss), rank 1 stages 1 and 2
    "pp2-m4": Case(dict(schedule="dualpipev", pp=2, vp=2, global_batch=4), model=dict(layers=4)),
    "pp2-m5": Case(dict(schedule="dualpipev", pp=2, vp=2, global_batch=5), model=dict(layers=4)),
}


@pytest.fixture(scope="module")
def world2() -> dict[str, list]:
    return _world(WORLD2, 2)


@pytest.mark.parametrize("name", list(WORLD2))
def test_dualpipev_trains_as_the_reference(world2: dict, name: str) -> None:
    _check(WORLD2[name], world2[name])
