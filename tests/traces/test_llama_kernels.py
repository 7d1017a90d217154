"""Llama-style kernels (issue 18): each new kernel's FLOPs and HBM bytes equal the hand-derived
formula for a small model — GQA with kv_heads in {1, 2, heads}, SwiGLU, RMSNorm, RoPE,
bias-free — forward and backward; parameters by hand; model FLOPs equal Megatron-LM's
`num_floating_point_operations` written as it is there."""

from __future__ import annotations

import dataclasses

import pytest

from tests.traces.megatron_count import megatron_fwd
from traces.errors import ConfigError
from traces.kernels import embedding_kernels, layer_kernels
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.purpose import Kernel as K
from traces.step_flops import megatron_num_flops, megatron_step_flops, model_flops

B, E = 2, 2  # micro-batch, bf16 bytes
H, A, S, F, V, D = 64, 4, 32, 96, 128, 16  # hidden, heads, seq, SwiGLU width, vocab, head dim


def llama(kv: int, **extra) -> ModelSpec:
    return ModelSpec(layers=2, hidden=H, heads=A, kv_heads=kv, seq_len=S, vocab=V, ffn="swiglu",
                     ffn_hidden=F, norm="rmsnorm", position="rope", bias=False,
                     tied_embeddings=False, **extra)


def by_name(model: ModelSpec, t: int, sp: bool = False) -> dict:
    return {k.name: k for k in layer_kernels(model, B, t, sp)}


CASES = [(kv, t) for kv in (1, 2, A) for t in (1, 2) if kv % t == 0]


@pytest.mark.parametrize(("kv", "t"), CASES)
def test_qkv_is_narrower_by_the_key_value_heads(kv, t):
    qkv = by_name(llama(kv), t)[K.QKV]
    n = (H + 2 * kv * D) // t  # q: h; k and v: g·d each
    m = B * S
    assert qkv.gemm == (1, m, n, H)
    assert qkv.flops == 2 * m * n * H and qkv.bwd_flops == 4 * m * n * H
    assert qkv.mem_bytes == (m * H + H * n + m * n) * E
    # dgrad reads dC, W, writes dA; wgrad reads A, dC and accumulates dW (read and write)
    assert qkv.bwd_bytes == (m * n + H * n + m * H) * E + (m * H + m * n) * E + 2 * H * n * E


@pytest.mark.parametrize(("kv", "t"), CASES)
def test_flash_attention_reads_kv_heads(kv, t):
    flash = by_name(llama(kv), t)[K.FLASH_ATTN]
    q_heads, kv_heads = B * A // t, B * kv // t
    assert flash.flops == 4 * q_heads * S * S * D / 2  # QKᵀ and AV, the causal half
    assert flash.bwd_flops == 2.5 * flash.flops
    io = (q_heads * 2 + kv_heads * 2) * S * D * E  # Q, O; K, V
    lse = q_heads * S * 4
    assert flash.mem_bytes == io + lse
    assert flash.bwd_bytes == io + lse + (q_heads * 2 + kv_heads * 2) * S * D * E


@pytest.mark.parametrize(("kv", "t"), CASES)
def test_unfused_attention_copies_kv_to_every_query_head(kv, t):
    unfused = by_name(llama(kv, attention="unfused"), t)
    mha = by_name(llama(A, attention="unfused"), t)
    copy = (B * A // t + B * kv // t) * S * D * E if kv < A else 0
    for name in (K.QK, K.AV):
        assert unfused[name].flops == mha[name].flops
        assert unfused[name].mem_bytes == mha[name].mem_bytes + copy
        assert unfused[name].bwd_bytes == mha[name].bwd_bytes + copy


@pytest.mark.parametrize(("kv", "t"), CASES)
def test_rope_rotates_q_and_k(kv, t):
    rope = by_name(llama(kv), t)[K.ROPE]
    both = 2 * B * S * (A + kv) * D // t * E + 4 * S * D  # q, k read and written; fp32 table
    assert (rope.flops, rope.mem_bytes, rope.bwd_flops, rope.bwd_bytes) == (0, both, 0, both)
    assert K.ROPE not in by_name(dataclasses.replace(llama(kv), position="learned"), t)


@pytest.mark.parametrize("t", [1, 2])
def test_swiglu_runs_three_gemms_and_a_gated_activation(t):
    k = by_name(llama(2), t)
    m = B * S
    assert k[K.FC1].gemm == (1, m, 2 * F // t, H)  # gate and up, fused as Megatron-Core does
    assert k[K.FC2].gemm == (1, m, H, F // t)
    assert k[K.FC1].flops + k[K.FC2].flops == 3 * 2 * m * H * F / t
    act = k[K.SWIGLU]
    n = m * F // t
    assert (act.mem_bytes, act.bwd_bytes) == (3 * n * E, 5 * n * E)
    biased = by_name(dataclasses.replace(llama(2), bias=True), t)[K.SWIGLU]
    assert biased.bwd_bytes == 7 * n * E  # + the fc1 bias gradient over gate and up
    assert K.GELU not in k


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (2, True)])
def test_rmsnorm_and_bias_free_residual_adds(t, sp):
    k = by_name(llama(2), t, sp)
    n = B * (S // t if sp else S) * H
    for name in (K.LN1, K.LN2):
        assert (k[name].mem_bytes, k[name].bwd_bytes) == (2 * n * E, 6 * n * E)
    for name in (K.BDA1, K.BDA2):  # no bias gradient's extra read of dx
        assert (k[name].mem_bytes, k[name].bwd_bytes) == (n * (3 * E + 1), n * (2 * E + 1))
    biased = by_name(dataclasses.replace(llama(2), bias=True), t, sp)
    assert biased[K.BDA1].bwd_bytes == n * (3 * E + 1)


def test_rotary_positions_have_no_table_in_the_embedding():
    _, pos = embedding_kernels(llama(2), B, 1, False)
    n = B * S * H
    assert (pos.mem_bytes, pos.bwd_bytes) == (n * (2 * E + 1), n * (2 * E + 1))


@pytest.mark.parametrize("kv", [1, 2, A])
def test_parameters_by_hand(kv):
    m = llama(kv)
    qkv, f1 = H * (H + 2 * kv * D), H * 2 * F
    layer = qkv + H * H + f1 + F * H + 2 * H  # two RMSNorm weights, no biases
    assert m.layer_params() == layer
    assert m.layer_params(2) == (qkv + H * H + f1 + F * H) / 2 + 2 * H
    assert m.embedding_params() == V * H  # no position table
    assert m.num_params() == 2 * layer + V * H + (H + V * H)  # untied output layer, final norm


def test_llama_3_70b_has_70_6_billion_parameters():
    m = ModelSpec(layers=80, hidden=8192, heads=64, kv_heads=8, seq_len=8192, vocab=128256,
                  ffn="swiglu", ffn_hidden=28672, norm="rmsnorm", position="rope", bias=False,
                  tied_embeddings=False)
    assert round(m.num_params() / 1e9, 1) == 70.6  # Meta's model card: 70.6B


@pytest.mark.parametrize("kv", [1, 2, A])
def test_model_flops_follow_megatron_with_gqa_and_swiglu(kv):
    m = llama(kv)
    assert model_flops(m, 8) == pytest.approx(megatron_num_flops(m, 8), rel=1e-12)
    # and the kernels add up to it: forward GEMMs per layer, times 3 for the backward
    per_layer = sum(megatron_fwd(k) for k in layer_kernels(m, 1, 1, False))
    assert model_flops(m, 8) == pytest.approx(3 * 8 * (2 * per_layer + 2 * S * H * V))


def test_gpt_shaped_numbers_do_not_change():
    gpt = ModelSpec(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200)
    assert model_flops(gpt, 1536) == pytest.approx(megatron_step_flops(gpt, 1536, False))
    assert megatron_num_flops(gpt, 1536) == pytest.approx(model_flops(gpt, 1536))
    assert gpt.kv_heads == gpt.heads and gpt.layer_params() == \
        (4 * 12288**2 + 3 * 12288 + 2 * 12288 * 4 * 12288 + 4 * 12288) + 6 * 12288


@pytest.mark.parametrize(("kwargs", "needle"), [
    (dict(kv_heads=3), "model.kv_heads: 3 does not divide model.heads = 4"),
    (dict(kv_heads=8), "model.kv_heads: 8 must be an integer from 1 to model.heads = 4"),
    (dict(kv_heads=-1), "model.kv_heads: -1 must be"),
    (dict(kv_heads=True), "model.kv_heads: True must be"),
    (dict(ffn="relu"), "model.ffn: 'relu' is not one of gelu, swiglu"),
    (dict(ffn="swiglu"), "model.ffn_hidden: required with ffn = \"swiglu\""),
    (dict(norm="batchnorm"), "model.norm: 'batchnorm' is not one of layernorm, rmsnorm"),
    (dict(position="alibi"), "model.position: 'alibi' is not one of learned, rope"),
    (dict(bias="no"), "model.bias: 'no' must be true or false"),
    (dict(fp8_recipe="nvfp4", dtype="fp8"), "model.fp8_recipe: 'nvfp4' is not one of"),
    (dict(fp8_recipe="mxfp8"), "model.fp8_recipe: 'mxfp8' applies only with model.dtype"),
])
def test_bad_values_are_one_line_errors(kwargs, needle):
    with pytest.raises(ConfigError, match=None) as caught:
        ModelSpec(layers=1, hidden=H, heads=A, seq_len=S, vocab=V, **kwargs)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_tp_must_divide_kv_heads():
    with pytest.raises(ConfigError, match="parallel.tp: 2 does not divide model.kv_heads = 1"):
        check_layout(llama(1), Layout(tp=2, global_batch=2))
