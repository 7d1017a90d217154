"""The MoE kernel keys simulated (`traces.moe_steps`): folding still equals the unfolded run,
and the unfused or per-expert kernels never make a step shorter than the fused ones."""

from __future__ import annotations

import pytest

from sim.config import experiment_from_dict
from sim.simulate import predict
from tests.sim.test_moe_step import _config

KEYS = {"moe_permute_fusion": False, "moe_router_fusion": False, "moe_grouped_gemm": False}


@pytest.mark.parametrize("model", [{key: value} for key, value in KEYS.items()] + [KEYS])
def test_unfused_kernels_fold_exactly_and_cost_more(model):
    base, _ = predict(experiment_from_dict(_config()), fold=True)
    exp = experiment_from_dict(_config(model=model))
    folded, _ = predict(exp, fold=True)
    unfolded, _ = predict(exp, fold=False)
    assert folded.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-9)
    assert folded.step_time_s > base.step_time_s
    assert folded.compute_s > base.compute_s
