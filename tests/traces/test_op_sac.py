"""`recompute = "selective_op"`: torchtitan's per-op rule (traces.op_sac) in the plan, the
FLOP count and the memory model, exact on a small Llama-style model."""

from __future__ import annotations

import dataclasses

import pytest

from sim.models.memory import activation_bytes_per_layer
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Phase
from traces.pipeline import build_schedule
from traces.plan.compute import lower_compute
from traces.plan.nodes import RankContext
from traces.step_flops import recompute_flops

# h 64, 4 heads of 16 (q = 64), 2 key/value heads (kv = 32), SwiGLU f = 96, s = 32
LLAMA = ModelSpec(layers=3, hidden=64, heads=4, kv_heads=2, ffn="swiglu", ffn_hidden=96,
                  norm="rmsnorm", position="rope", bias=False, dropout=0.0, seq_len=32,
                  vocab=128, attention="flash")
H, Q, KV, F, S, A = 64, 64, 32, 96, 32, 4


def backward_ops(model: ModelSpec, **parallel: object):
    layout = Layout(**{"recompute": "selective_op", "global_batch": 1, **parallel})
    ctx = RankContext(model=model, layout=layout, rank=0)
    program = lower_compute(ctx, build_schedule("1f1b", 1, 1)[0])
    return [n.op for n in program[1]]


def test_the_even_mms_and_every_pointwise_kernel_are_rerun_before_the_backward():
    ops = backward_ops(LLAMA)
    per_layer = ["ln1", "qkv", "rope", "proj", "bda1", "ln2", "fc1", "swiglu", "bda2"]
    recomputed = [op for op in ops if op.phase is Phase.RECOMPUTE]
    assert [op.name for op in recomputed] == per_layer * LLAMA.layers  # not flash_attn, fc2
    first = next(i for i, op in enumerate(ops) if op.phase is Phase.RECOMPUTE)
    assert all(op.phase is Phase.RECOMPUTE for op in ops[first:first + len(per_layer)])
    qkv, proj, fc1 = (next(op for op in recomputed if op.name == n)
                      for n in ("qkv", "proj", "fc1"))
    assert qkv.gemm == (1, S, KV, H)  # wk: mm 2 of wq, wk, wv
    assert proj.gemm == (1, S, H, Q)  # wo: mm 4
    assert fc1.gemm == (1, S, F, H)  # w3: mm 6 of w1, w3 (w2, mm 7, saved)


def test_recomputed_flops_equal_the_closed_form_and_the_plan():
    per_layer = 2 * S * (H * KV + Q * H + H * F)  # wk, wo, w3
    assert recompute_flops(LLAMA, 5, "selective_op") == 5 * LLAMA.layers * per_layer
    ops = backward_ops(LLAMA)
    planned = sum(op.flops for op in ops if op.phase is Phase.RECOMPUTE)
    assert planned == LLAMA.layers * per_layer


def test_fp8_gemms_are_scaled_mm_and_all_rerun():
    fp8 = dataclasses.replace(LLAMA, dtype="fp8")
    per_layer = 2 * S * (H * (Q + 2 * KV) + Q * H + H * 2 * F + F * H)
    assert recompute_flops(fp8, 1, "selective_op") == LLAMA.layers * per_layer
    planned = sum(op.flops for op in backward_ops(fp8) if op.phase is Phase.RECOMPUTE)
    assert planned == LLAMA.layers * per_layer


@pytest.mark.parametrize("tp, sp", [(1, False), (2, True)])
def test_stored_activations_are_the_saved_outputs(tp, sp):
    layout = Layout(recompute="selective_op", tp=tp, sp=sp, micro_batch=2, global_batch=2)
    b, t = 2, tp
    tokens = S * b
    elements = (tokens * H / (t if sp else 1)  # the block's input
                + tokens * Q / t + tokens * A / t * 4 / 2  # sdpa's output, fp32 log-sum-exp
                + tokens * (Q + KV + F) / t  # wq, wv, w1
                + tokens * H  # w2's output (before its reduce-scatter)
                + (2 * tokens * H / t if t > 1 else 0))  # the two reduce-scatters' outputs
    assert activation_bytes_per_layer(LLAMA, layout) == pytest.approx(2 * elements, rel=1e-12)
    none = activation_bytes_per_layer(LLAMA, dataclasses.replace(layout, recompute="none"))
    full = activation_bytes_per_layer(LLAMA, dataclasses.replace(layout, recompute="full"))
    assert full < activation_bytes_per_layer(LLAMA, layout) < none


def test_refused_for_experts_and_latent_attention():
    moe = dataclasses.replace(LLAMA, experts=4, top_k=2, moe_ffn_hidden=32)
    with pytest.raises(ConfigError, match="selective_op"):
        recompute_flops(moe, 1, "selective_op")
