"""Issue 32, model shapes as published (`traces.heads`): a head width of its own and per-head
q/k norms. Qwen3-8B's, Qwen3-32B's and Qwen3-235B-A22B's parameter counts from their config
by hand; FLOPs
equal to Megatron-LM's num_floating_point_operations with kv_channels; each changed kernel,
activation and CP exchange by its formula; one-line errors; a default head_dim plans the very
same trace as one stated as hidden / heads."""

from __future__ import annotations

import dataclasses

import pytest

from sim.models.memory import activation_terms
from tests.traces.megatron_count import megatron_fwd
from traces.errors import ConfigError
from traces.header import TraceMeta
from traces.header_json import meta_from_json, meta_to_json
from traces.io import dumps
from traces.kernels import layer_kernels
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.plan import build
from traces.plan.context import kv_block_bytes
from traces.plan.nodes import RankContext
from traces.purpose import Kernel as K
from traces.step_flops import megatron_num_flops, model_flops


def qwen3(layers: int, hidden: int, heads: int, ffn: int, **extra: object) -> ModelSpec:
    """A Qwen3 dense model as its Hugging Face config.json states it: head_dim 128, 8 key/value
    heads, SwiGLU, RMSNorm with q_norm/k_norm, RoPE, no biases, vocab_size 151936, untied."""
    spec = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=8, head_dim=128,
                qk_norm=True, ffn="swiglu", ffn_hidden=ffn, norm="rmsnorm", position="rope",
                bias=False, dropout=0.0, vocab=151936, seq_len=4096, tied_embeddings=False)
    return ModelSpec(**{**spec, **extra})  # type: ignore[arg-type]


QWEN3_8B = qwen3(36, 4096, 32, 12288)  # Qwen/Qwen3-8B config.json
QWEN3_32B = qwen3(64, 5120, 64, 25600)  # Qwen/Qwen3-32B config.json


def test_qwen3_8b_has_its_published_parameters():
    """Qwen3-8B's model card: 8.2B parameters, 6.95B without the embeddings. From config.json
    (h 4096, a 32 of d 128, g 8, f 12288, 36 layers, V 151936, untied):
        per layer   q 4096·4096 + k, v 2·4096·1024 + o 4096·4096  =  41,943,040
                    q_norm, k_norm 2·128                          =         256
                    MLP 3·4096·12288 (gate, up, down)             = 150,994,944
                    input and post-attention RMSNorms 2·4096      =       8,192
                                                                   = 192,946,432
        36 layers 6,946,071,552 + final norm 4,096 = 6,946,075,648 (the card's 6.95B)
        + embedding and untied head 2·151936·4096 = 1,244,659,712 -> 8,190,735,360"""
    m = QWEN3_8B
    assert m.layer_params() == 192_946_432
    assert m.num_params() - 2 * m.vocab * m.hidden == 6_946_075_648
    assert m.num_params() == 8_190_735_360
    assert round(m.num_params() / 1e9, 1) == 8.2


def test_qwen3_32b_has_its_published_parameters():
    """Qwen3-32B's model card: 32.8B parameters, 31.2B without the embeddings. From
    config.json (h 5120, a 64 of d 128 so q is 8192 wide, g 8, f 25600, 64 layers):
        per layer   q 5120·8192 + k, v 2·5120·1024 + o 8192·5120  =  94,371,840
                    q_norm, k_norm 2·128                          =         256
                    MLP 3·5120·25600                              = 393,216,000
                    two RMSNorms 2·5120                           =      10,240
                                                                   = 487,598,336
        64 layers 31,206,293,504 + final norm 5,120 = 31,206,298,624 (31.2B)
        + 2·151936·5120 = 1,555,824,640 -> 32,762,123,264 (32.8B)"""
    m = QWEN3_32B
    assert m.q_width == 8192 > m.hidden
    assert m.layer_params() == 487_598_336
    assert m.num_params() - 2 * m.vocab * m.hidden == 31_206_298_624
    assert m.num_params() == 32_762_123_264


def test_qwen3_235b_a22b_has_its_published_total_and_active_parameters():
    """Qwen3-235B-A22B's model card: 235B parameters, 22B activated, 234B without the
    embeddings. Its config (h 4096, a 64 of d 128 so q is 8192 wide, g 4, 94 layers all MoE,
    128 experts of 1536 top-8, no shared expert, V 151936, untied):
        per layer   q 4096·8192 + k, v 2·4096·512 + o 8192·4096     =    71,303,168
                    q_norm, k_norm 2·128 + two RMSNorms 2·4096      =         8,448
                    router 128·4096                                 =       524,288
                    experts 128·3·4096·1536                         = 2,415,919,104
                                                                     = 2,487,755,008
        94 layers + final norm 4,096 = 233,848,974,848 (234B) + 2·151936·4096
        = 235,093,634,560; activated: 8 of the 128 experts, 235,093,634,560
        - 94·120·18,874,368 = 22,190,763,520"""
    m = qwen3(94, 4096, 64, 12288, kv_heads=4, experts=128, top_k=8, moe_ffn_hidden=1536)
    assert m.layer_params(1, 0) == 2_487_755_008
    assert m.num_params() - 2 * m.vocab * m.hidden == 233_848_974_848
    assert m.num_params() == 235_093_634_560
    assert m.active_params() == 22_190_763_520


def test_tensor_parallel_splits_the_heads_and_replicates_qk_norm():
    """At t = 8: q, k, v, o and the MLP split by 8; the two RMSNorms and q_norm/k_norm
    (2h + 2d) on every rank, as Megatron-Core keeps q_layernorm/k_layernorm."""
    m, t = QWEN3_32B, 8
    split = 5120 * (8192 + 2 * 1024) + 8192 * 5120 + 3 * 5120 * 25600
    assert m.layer_params(t) == split / t + 2 * 5120 + 2 * 128


@pytest.mark.parametrize("model", [QWEN3_8B, QWEN3_32B], ids=["8b", "32b"])
def test_flops_equal_megatrons_formula_with_kv_channels(model):
    """model_flops (the kernels' arithmetic) equals Megatron-LM's num_floating_point_operations
    with kv_channels = 128 (query_projection_to_hidden_size_ratio = 128·a/h), and both equal
    3·B·s·n·(4h(q + gd) + 4s·q + 6hf) + 6Bs·hV per step (q = ad: the QKV and o projections,
    the QKᵀ and AV of full s², SwiGLU's three GEMMs; forward and twice it backward)."""
    B, s, n, h, q, gd, f, V = 16, model.seq_len, model.layers, model.hidden, model.q_width, \
        model.kv_width, model.ffn_hidden, model.vocab
    by_hand = 3 * B * s * n * (4 * h * (q + gd) + 4 * s * q + 6 * h * f) + 6 * B * s * h * V
    assert model_flops(model, B) == pytest.approx(by_hand, rel=1e-12)
    assert megatron_num_flops(model, B) == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize("model", [QWEN3_8B, QWEN3_32B], ids=["8b", "32b"])
def test_megatrons_causal_count_halves_the_core_alone(model):
    """Megatron-LM's later count (s/h halved for the causal mask) is the full count less half
    the core's 3·B·s·n·4s·q: 3·B·s·n·(4h(q + gd) + 2s·q + 6hf) + 6Bs·hV."""
    B, s, n, h, q, gd, f, V = 16, model.seq_len, model.layers, model.hidden, model.q_width, \
        model.kv_width, model.ffn_hidden, model.vocab
    by_hand = 3 * B * s * n * (4 * h * (q + gd) + 2 * s * q + 6 * h * f) + 6 * B * s * h * V
    assert megatron_num_flops(model, B, causal=True) == pytest.approx(by_hand, rel=1e-12)


def test_layer_kernels_sum_to_the_attention_and_mlp_flops():
    """The per-kernel FLOPs of one layer on one TP rank add up to attn_flops + mlp_flops: qkv
    (b·s, (q + 2gd)/t, h), the core 4·b·s²·q/t, proj (b·s, h, q/t)."""
    m, b, t = QWEN3_32B, 1, 8
    ks = {k.name: k for k in layer_kernels(m, b, t, False)}
    n = b * m.seq_len
    assert ks[K.QKV].gemm == (1, n, (8192 + 2 * 1024) // t, 5120)
    assert ks[K.PROJ].gemm == (1, n, 5120, 8192 // t)
    assert ks[K.FLASH_ATTN].flops == 4 * b * m.seq_len ** 2 * 8192 / t / 2  # causal half
    total = sum(megatron_fwd(k) for k in ks.values())
    assert total == m.attn_flops(b, t) + m.mlp_flops(b, t)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_qk_norm_kernel_moves_each_q_and_k_head_once(t):
    """qk_norm between qkv and rope over b·s·(a + g)d/t elements: fwd read and write 2ne, bwd
    read x and dy, write dx 3ne, no FLOPs; none without qk_norm."""
    m, b = QWEN3_8B, 2
    names = [k.name for k in layer_kernels(m, b, t, False)]
    assert names[names.index(K.QKV) + 1:names.index(K.QKV) + 3] == [K.QK_NORM, K.ROPE]
    work = next(k for k in layer_kernels(m, b, t, False) if k.name is K.QK_NORM)
    n = b * m.seq_len * (32 + 8) * 128 // t
    assert (work.flops, work.mem_bytes, work.bwd_flops, work.bwd_bytes) == \
        (0.0, 2 * n * 2, 0.0, 3 * n * 2)
    plain = dataclasses.replace(m, qk_norm=False)
    assert K.QK_NORM not in [k.name for k in layer_kernels(plain, b, t, False)]


def test_activations_scale_with_the_query_width_and_keep_qk_norms_inputs():
    """Per s·b·h: Q, K, V and the proj input (4 + 4g/a)·ad/h, and qk_norm's saved inputs
    2(1 + g/a)·ad/h (the q and k heads before the norm, 2 bytes each)."""
    m = QWEN3_32B
    mlp = 6 * 25600 / 5120
    ratio = 8192 / 5120
    assert activation_terms(m) == (8, (4 + 4 * 8 / 64) * ratio + 2 * (1 + 8 / 64) * ratio + mlp)
    plain = dataclasses.replace(m, qk_norm=False)
    assert activation_terms(plain) == (8, (4 + 4 * 8 / 64) * ratio + mlp)


def test_context_parallel_exchanges_kv_heads_of_head_dim():
    """A CP K/V block is b·(s/cp) tokens of K and V, g/t heads of d each: not h wide."""
    m = qwen3(4, 512, 8, 1024, seq_len=1024, vocab=1024)  # q 8·128 = 1024, twice h
    layout = Layout(tp=2, cp=2, global_batch=1, micro_batch=1)
    ctx = RankContext(model=m, layout=layout, rank=0)
    assert kv_block_bytes(ctx) == 1 * (1024 // 2) * 2 * (8 // 2) * 128 * 2


def small(**extra: object) -> ModelSpec:
    spec = dict(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, kv_heads=2)
    return ModelSpec(**{**spec, **extra})  # type: ignore[arg-type]


def test_a_default_head_dim_plans_the_same_trace_as_hidden_over_heads():
    """head_dim left out and head_dim = h/a stated build byte-identical plans (header
    included: head_dim is omitted as a default), and qk_norm = false states nothing."""
    layout = Layout(tp=2, pp=2, global_batch=4)
    stated = dumps(build(small(head_dim=16, qk_norm=False), layout))
    assert dumps(build(small(), layout)) == stated
    assert '"head_dim"' not in stated and '"qk_norm"' not in stated


def test_the_header_states_a_head_width_of_its_own_and_qk_norm():
    m = small(hidden=60, heads=4, head_dim=32, qk_norm=True, norm="rmsnorm")  # 60 % 4 = 0
    raw = meta_to_json(TraceMeta(model=m))["model"]
    assert raw["head_dim"] == 32 and raw["qk_norm"] is True
    assert meta_from_json({"model": raw}, 3).model == m
    odd = small(hidden=66, heads=4, head_dim=16)  # no h/a default to leave out
    assert meta_from_json({"model": meta_to_json(TraceMeta(model=odd))["model"]}, 3).model == odd


@pytest.mark.parametrize(("extra", "start"), [
    (dict(head_dim=-1), "model.head_dim: -1 must be an integer from 1 to 65,536"),
    (dict(head_dim=2**17), "model.head_dim: 131072 must be an integer from 1 to 65,536"),
    (dict(head_dim=65536, heads=128, kv_heads=2), "model.head_dim: 65536 x model.heads 128"),
    (dict(head_dim=True), "model.head_dim: True must be an integer"),
    (dict(hidden=66), "model.hidden: 66 is not divisible by model.heads = 4"),
    (dict(qk_norm="yes"), "model.qk_norm: 'yes' must be true or false"),
    (dict(qk_norm=True, kv_lora_rank=8, qk_rope_head_dim=4, kv_heads=4, norm="rmsnorm",
          position="rope", bias=False), "model.qk_norm: true: latent attention"),
])
def test_bad_shapes_are_one_line_naming_the_field(extra, start):
    with pytest.raises(ConfigError) as err:
        small(**extra)
    assert str(err.value).startswith(start) and "\n" not in str(err.value)


@pytest.mark.parametrize(("extra", "tp", "start"), [
    (dict(heads=6, kv_heads=6, hidden=64, head_dim=16), 4, "parallel.tp: 4 does not divide "
     "model.heads = 6"),
    (dict(heads=8, kv_heads=2, hidden=64, head_dim=32), 4, "parallel.tp: 4 does not divide "
     "model.kv_heads = 2"),
])
def test_tp_still_divides_heads_and_kv_heads(extra, tp, start):
    """A head width of its own changes no TP rule: t divides a and g (whole query groups)."""
    with pytest.raises(ConfigError) as err:
        check_layout(small(**extra), Layout(tp=tp, global_batch=1))
    assert str(err.value).startswith(start) and "\n" not in str(err.value)
