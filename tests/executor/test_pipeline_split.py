"""The plan interpreter on Megatron-Core's pipeline splits (`traces.stage_split`): the
embedding and the loss counted as layers, and stated layouts whose end stages hold no layer or
whose middle stage holds nothing at all, each trained as the single-process reference with its
plan's communication and nothing else."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from tests.executor.test_interpreter import _check, _world
from tests.executor.workers import Case

INTERLEAVED = dict(pp=2, vp=2, schedule="interleaved", global_batch=4)
CASES = {
    # 2 layers + E + L over PP 2: rank 0 holds E and layer 0, rank 1 layer 1 and L
    "1f1b-account-both": Case(dict(pp=2, global_batch=4, account_for_embedding=True,
                                   account_for_loss=True)),
    # 5 + E = 6 over PP 2 x VP 2 is 1.5: refused; 7 + E = 8: stages 1, 2, 2, 2
    "interleaved-account-embedding": Case(dict(INTERLEAVED, account_for_embedding=True),
                                          model=dict(layers=7)),
    # 6 + E + L = 8: stages 1, 2, 2, 1
    "interleaved-account-both": Case(dict(INTERLEAVED, account_for_embedding=True,
                                          account_for_loss=True), model=dict(layers=6)),
    # the end stages hold the embedding and the loss only
    "layout-ends-alone": Case(dict(INTERLEAVED, pipeline_layout="E|tt|tt|L"),
                              model=dict(layers=4)),
    # stage 1 (rank 1's first chunk) holds nothing: it passes activations and gradients on
    "layout-empty-stage": Case(dict(INTERLEAVED, pipeline_layout="Et||(t)*2|L"),
                               model=dict(layers=3)),
}


@pytest.fixture(scope="module")
def world2() -> dict[str, list]:
    return _world(CASES, 2)


@pytest.mark.parametrize("name", list(CASES))
def test_split_trains_as_the_reference(world2: dict, name: str) -> None:
    _check(CASES[name], world2[name])
