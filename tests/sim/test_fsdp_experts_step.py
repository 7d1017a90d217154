"""ZeRO 3 with expert parallelism, simulated: the plan folds exactly, and its step carries
the experts' gathers and reduce-scatters over expert-DP (`traces.plan.data`) where ZeRO 1
reduces them once per step and gathers them after it."""

from __future__ import annotations

import pytest

from sim.config import experiment_from_dict
from sim.simulate import predict
from traces.purpose import ExpertGrads, ExpertParamGather, ExpertUnitGather

CONFIG = {
    "model": {"layers": 2, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 4096,
              "ffn": "swiglu", "ffn_hidden": 1024, "experts": 16, "top_k": 2,
              "moe_ffn_hidden": 256, "bias": False},
    "parallel": {"dp": 16, "ep": 4, "zero": 3, "global_batch": 32},
    "cluster": {"preset": "dgx-h100", "nodes": 2, "fabric": "rail"},
}


def test_fsdp_with_experts_folds_exactly_and_moves_the_expert_bytes():
    exp = experiment_from_dict(CONFIG)
    folded, times = predict(exp, fold=True)
    unfolded, _ = predict(exp, fold=False)
    assert folded.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-9)
    ops = times.plan.ops[0]
    m, layers, local = 2, 2, 16 // 4 * 3 * 512 * 256  # micro-batches, MoE layers, E/ep experts
    gathers = [op for op in ops if isinstance(op.purpose, ExpertUnitGather)]
    assert sum(op.size_bytes for op in gathers) == 2 * m * layers * local * 2
    assert all(len(op.group) == 16 // 4 for op in gathers)
    reduces = [op for op in ops if isinstance(op.purpose, ExpertGrads)]
    assert len(reduces) == m * layers
    assert not any(isinstance(op.purpose, ExpertParamGather) for op in ops)  # none after
