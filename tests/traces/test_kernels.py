"""Kernel-level FLOPs and HBM bytes against hand-derived formulas and Megatron's closed forms."""

from __future__ import annotations

import dataclasses

import pytest

from tests.traces.megatron_count import megatron_fwd
from traces.kernels import (
    embedding_kernels,
    head_kernels,
    layer_kernels,
    optimizer_bytes_per_param,
    softmax_bytes,
    step_kernel_bytes,
)
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase
from traces.plan import build
from traces.purpose import GradStat, Kernel, StepStat
from traces.step_flops import megatron_step_flops

# b = 2, s = 32, h = 64, a = 4, f = 256, V = 128, bf16.
FLASH = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=128)
UNFUSED = dataclasses.replace(FLASH, attention="unfused")
B, S, H, A, F, V, E = 2, 32, 64, 4, 256, 128, 2


def by_name(kernels):
    return {k.name: k for k in kernels}


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("model", [FLASH, UNFUSED])
def test_layer_gemm_flops_add_up_to_megatrons_24bsh2(model, t):
    kernels = layer_kernels(model, B, t, sp=False)
    forward = sum(megatron_fwd(k) for k in kernels)
    assert forward * t == pytest.approx(24 * B * S * H * H * (1 + S / (6 * H)), rel=1e-12)
    gemms = [k for k in kernels if k.name != "flash_attn"]
    assert sum(k.bwd_flops for k in gemms) == pytest.approx(2 * sum(k.flops for k in gemms))


def test_step_flops_of_a_plan_equal_megatrons_72_and_96_forms():
    model = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, attention="unfused")
    for recompute, full in (("none", False), ("full", True)):
        layout = Layout(global_batch=4, recompute=recompute)
        plan = build(model, layout)
        flops = sum(op.flops for op in plan.ops[0])
        assert flops == pytest.approx(megatron_step_flops(model, 4, full), rel=1e-12)


def test_unfused_gemm_shapes_and_memory_bound_bytes_by_hand():
    k = by_name(layer_kernels(UNFUSED, B, 2, sp=False))
    heads, d = B * A // 2, H // A  # 4 heads of 16 per TP rank
    assert k["qkv"].gemm == (1, B * S, 3 * H // 2, H)
    assert k["qk"].gemm == (heads, S, S, d) and k["av"].gemm == (heads, S, d, S)
    assert k["proj"].gemm == (1, B * S, H, H // 2)
    assert k["fc1"].gemm == (1, B * S, F // 2, H) and k["fc2"].gemm == (1, B * S, H, F // 2)
    scores = heads * S * S
    # Megatron's fused causal softmax reads only the unmasked (s+1)/(2s) of the scores.
    c = (S + 1) / (2 * S)
    assert k["softmax"].mem_bytes == scores * E * (c + 1)
    assert k["softmax"].bwd_bytes == scores * E * (2 * c + 1)
    assert k["attn_dropout"].mem_bytes == scores * (2 * E + 1)
    # qk reads Q and K, writes the scores: 2·b·s·h/t + b·a/t·s² elements.
    assert k["qk"].mem_bytes == (2 * B * S * H // 2 + scores) * E
    # Without SP the norms and dropouts see every token on every TP rank. A layer's norms'
    # backward also sums the residual's two gradients (read 2, write 1 more b·s·h).
    assert k["ln1"].mem_bytes == 2 * B * S * H * E and k["ln1"].bwd_bytes == 6 * B * S * H * E
    assert k["ln2"].bwd_bytes == 6 * B * S * H * E
    # bda backward: dropout's backward (dy, mask in; dx out), then the bias gradient re-reads dx.
    assert k["bda1"].mem_bytes == B * S * H * (3 * E + 1)
    assert k["bda1"].bwd_bytes == B * S * H * (2 * E + 1) + B * S * H * E
    # GeLU backward: x, dy in, dx out, and the fc1 bias gradient's sum re-reads dx.
    assert k["gelu"].mem_bytes == 2 * B * S * F // 2 * E
    assert k["gelu"].bwd_bytes == 4 * B * S * F // 2 * E


def test_sequence_parallelism_shards_norms_and_dropouts_only():
    plain = by_name(layer_kernels(UNFUSED, B, 2, sp=False))
    sharded = by_name(layer_kernels(UNFUSED, B, 2, sp=True))
    for name in ("ln1", "ln2", "bda1", "bda2"):
        assert sharded[name].mem_bytes * 2 == plain[name].mem_bytes
    for name in ("qkv", "qk", "softmax", "gelu", "fc2"):
        assert sharded[name] == plain[name]


def test_flash_kernel_reads_qkv_writes_o_and_the_log_sum_exp():
    (flash,) = [k for k in layer_kernels(FLASH, B, 1, sp=False) if k.name == "flash_attn"]
    qkvo = 4 * B * S * H * E
    lse = B * A * S * 4
    assert flash.flops == 4 * B * S * S * H / 2  # the causal half it executes
    assert flash.bwd_flops == 2.5 * flash.flops  # QKᵀ recomputed: 5 products to 2
    assert flash.mem_bytes == qkvo + lse
    assert flash.bwd_bytes == qkvo + lse + 4 * B * S * H * E  # dO read; dQ, dK, dV written
    unfused = [k.name for k in layer_kernels(UNFUSED, B, 1, sp=False)]
    assert unfused[2:6] == ["qk", "softmax", "attn_dropout", "av"]


def test_gemm_backward_reads_and_writes_each_operand_of_its_two_products():
    qkv = by_name(layer_kernels(FLASH, B, 1, sp=False))["qkv"]
    m, n, k = B * S, 3 * H, H
    forward = (m * k + k * n + m * n) * E
    assert qkv.mem_bytes == forward
    # dA = dC·Bᵀ reads dC, B, writes dA; dB = Aᵀ·dC reads A, dC and accumulates dB (r+w).
    assert qkv.bwd_bytes == (m * n + k * n + m * k) * E + (m * k + m * n) * E + 2 * k * n * E
    fp32 = by_name(layer_kernels(FLASH, B, 1, sp=False, grad_bytes=4))["qkv"]
    assert fp32.bwd_bytes - qkv.bwd_bytes == 2 * k * n * (4 - E)


def test_outside_the_layers():
    embed, pos = embedding_kernels(FLASH, B, 2, sp=True)
    assert embed.mem_bytes == 2 * B * S * H * E
    assert pos.mem_bytes == B * S // 2 * H * (2 * E + 1) + S // 2 * H * E
    final_ln, logits, ce = head_kernels(FLASH, B, 2, sp=False)
    assert logits.gemm == (1, B * S, V // 2, H) and logits.flops == 2 * B * S * H * V / 2
    # fp32 passes: cast (E + 4), max 4, subtract 8, exp 8, sum 4, divide 8; back: scale 8, cast
    assert ce.mem_bytes == B * S * V // 2 * (36 + E) and ce.bwd_bytes == B * S * V // 2 * (12 + E)
    assert final_ln.mem_bytes == 2 * B * S * H * E
    assert final_ln.bwd_bytes == 3 * B * S * H * E  # one consumer: no residual sum


def test_sequence_parallel_grads_are_summed_over_tp_before_dp_reduction():
    model = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=128)
    plan = build(model, Layout(tp=2, sp=True, dp=2, global_batch=2))
    ops = plan.ops[0]
    sp = [op for op in ops if op.name.startswith("sp_grads")]
    assert [op.name for op in sp] == ["sp_grads.head", "sp_grads", "sp_grads", "sp_grads.embed"]
    assert [op.size_bytes for op in sp] == [2 * 64 * 2, 6 * 64 * 2, 6 * 64 * 2, 32 * 64 * 2]
    assert all(op.group == (0, 1) and op.kind is OpKind.ALL_REDUCE for op in sp)
    first_grads = next(i for i, op in enumerate(ops) if op.name == "grads")
    assert ops.index(sp[0]) < first_grads


def test_without_overlap_every_bucket_waits_for_the_end_of_the_backward():
    model = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128)
    plain = dict(dp=2, global_batch=4, bucket_bytes=20_000)
    overlapped = build(model, Layout(**plain)).ops[0]
    deferred = build(model, Layout(**plain, overlap_grad_reduce=False)).ops[0]

    def buckets(ops):
        return [(i, op.size_bytes) for i, op in enumerate(ops) if op.name == "grads"]

    assert [s for _, s in buckets(overlapped)] == [s for _, s in buckets(deferred)]
    last_compute = max(i for i, op in enumerate(deferred)
                       if op.kind is OpKind.COMPUTE and op.phase is not Phase.OPT)
    assert all(i > last_compute for i, _ in buckets(deferred))
    assert any(i < max(j for j, op in enumerate(overlapped) if op.kind is OpKind.COMPUTE
                       and op.name == "embed") for i, _ in buckets(overlapped))


def test_fp32_main_grads_reduce_four_bytes_and_gather_two():
    model = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=128)
    ops = build(model, Layout(dp=2, zero=1, global_batch=2, fp32_main_grads=True)).ops[0]
    grads = [op for op in ops if op.name == "grads"]
    params = [op for op in ops if op.name == "params"]
    assert sum(op.size_bytes for op in grads) == 4 * model.num_params()
    assert sum(op.size_bytes for op in params) == 2 * model.num_params()
    assert {op.dtype for op in grads} == {"fp32"} and {op.dtype for op in params} == {"bf16"}


@pytest.mark.parametrize(("dtype", "grad_bytes", "expected"), [
    ("fp16", 2, 8 + 4 + 8 + 6 + 28 + 6 + 2),  # unscale, norm, clip; to fp32, Adam, to fp16, zero
    ("fp16", 4, 8 + 4 + 8 + 28 + 6 + 4),  # fp32 main grads: no copy
    ("bf16", 2, 4 + 8 + 6 + 28 + 6 + 2),  # no loss scale
    ("bf16", 4, 4 + 8 + 28 + 6 + 4),
    ("fp32", 4, 4 + 8 + 28 + 4),  # no main copies at all
])
def test_optimizer_bytes_follow_megatrons_mixed_precision_step(dtype, grad_bytes, expected):
    assert optimizer_bytes_per_param(dtype, grad_bytes) == expected
    kernels = [k for k, _ in step_kernel_bytes(dtype, grad_bytes)]
    assert kernels == ([Kernel.GRAD_UNSCALE] if dtype == "fp16" else []) + [
        Kernel.GRAD_NORM, Kernel.GRAD_CLIP, Kernel.OPTIMIZER]


def test_the_plans_optimizer_op_moves_those_bytes_for_its_shard():
    model = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, dtype="fp16")
    layout = Layout(dp=2, zero=1, global_batch=2)
    ops = build(model, layout).ops[0]
    steps = [op for op in ops if op.phase is Phase.OPT and op.kind is OpKind.COMPUTE]
    assert [op.name for op in steps] == ["grad_unscale", "grad_norm", "grad_clip", "optimizer"]
    shard = model.params_on_stages(layout.stages_of_rank(0), layout.num_stages, layout.tp) / 2
    assert [op.mem_bytes for op in steps] == [shard * 8, shard * 4, shard * 8, shard * 42]
    # fp16: the found-inf check and the norm, one fp32 each, all-reduced over every rank
    stats = [op for op in ops if isinstance(op.purpose, GradStat)]
    assert [(op.purpose.stat, op.kind, op.group, op.size_bytes) for op in stats] == [
        (StepStat.FOUND_INF, OpKind.ALL_REDUCE, (0, 1), 4.0),
        (StepStat.NORM, OpKind.ALL_REDUCE, (0, 1), 4.0)]


def test_softmax_falls_back_to_pytorchs_fp32_path_where_the_fused_kernel_does_not_apply():
    heads = 4
    for s in (4096, 2044 + 2):  # longer than the kernel takes; not a multiple of 4
        scores = heads * s * s
        assert softmax_bytes(scores, s, heads, 2) == (scores * 36, scores * 40)
    assert softmax_bytes(3 * 64 * 64, 64, 3, 2) == (3 * 64 * 64 * 36, 3 * 64 * 64 * 40)
    assert softmax_bytes(64 * 64, 64, 1, 4)[0] == 64 * 64 * 24  # fp32: no casts
    # at s = 2048 the fused kernel moves ~3 bytes per score forward, ~4 backward: 12x less
    fwd, bwd = softmax_bytes(4 * 2048 * 2048, 2048, 4, 2)
    assert fwd / (4 * 2048 * 2048) == pytest.approx(3, abs=0.01)
    assert bwd / (4 * 2048 * 2048) == pytest.approx(4, abs=0.01)
