"""Transformer Engine's FP8 saved activations (issue 32, `traces.te_fp8_memory`): per
s·b·h, exact, on a small Llama-shaped layer (h 64, 4 heads, 2 KV heads, SwiGLU f 96, no
dropout). bf16: norms' inputs 2 + 2, qkv and fc1 inputs 2 + 2, Q 2, K and V 2·g/a each,
proj input 2, SwiGLU 6f/h = 9: 23."""

from __future__ import annotations

import dataclasses

import pytest

from sim.models.memory import activation_bytes_per_layer
from traces.layout import Layout
from traces.model import ModelSpec

S, H = 32, 64
LLAMA = ModelSpec(layers=2, hidden=H, heads=4, kv_heads=2, seq_len=S, vocab=128,
                  ffn="swiglu", ffn_hidden=96, norm="rmsnorm", position="rope", bias=False,
                  dropout=0.0)
SBH = S * H


def fp8(recipe: str, **over: object) -> ModelSpec:
    return dataclasses.replace(LLAMA, dtype="fp8", fp8_recipe=recipe, **over)


def per_sbh(model: ModelSpec, **layout: object) -> float:
    return activation_bytes_per_layer(model, Layout(**layout)) / SBH


def test_bf16_is_the_korthikanti_count():
    assert per_sbh(LLAMA) == 23


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_per_tensor_scaling_keeps_one_fp8_copy_of_each_linear_input(recipe):
    # qkv and fc1 inputs 2 -> 1 each (-2); fc2's input 2f/h = 3 -> 1.5; proj's FP8 copy
    # beside the attention's bf16 output: +1 (ad/h = 1).
    assert per_sbh(fp8(recipe)) == 23 - 2 - 1.5 + 1 == 20.5


@pytest.mark.parametrize("recipe", ["mxfp8", "blockwise"])
def test_block_scales_add_a_thirty_second_of_a_byte_per_saved_value(recipe):
    # E8M0 per 32 values (MXFP8), fp32 per 128 (1x128 blocks): 1/32 B a value either way,
    # on qkv's and fc1's inputs (2 values per s·b·h), proj's (1) and fc2's (1.5).
    q = 1 / 32
    assert per_sbh(fp8(recipe)) == 8 - 2 * (1 - q) + 6 + 1 + q + 9 - 1.5 * (1 - q)
    assert per_sbh(fp8(recipe)) == pytest.approx(20.5 + 4.5 / 32)


def test_sequence_parallel_divides_every_term_by_tp():
    assert per_sbh(fp8("tensorwise"), tp=2, sp=True) == 20.5 / 2
    # without SP the replicated terms (norm inputs 4, qkv/fc1 inputs 1 + 1) stay whole
    assert per_sbh(fp8("tensorwise"), tp=2) == 6 + 14.5 / 2


def test_with_the_core_recomputed_the_fp8_copy_replaces_the_bf16_output():
    # selective: the attention's bf16 output is not kept, proj's FP8 copy is: 2 -> 1
    assert per_sbh(fp8("delayed"), recompute="selective") == 23 - 2 - 1.5 - 1 == 18.5
    assert per_sbh(LLAMA, recompute="selective") == 23


def test_torchao_stacks_keep_the_bf16_count():
    # torchao's float8 linear saves its bf16 input and casts again in backward
    for kernels in ("compiled", "eager"):
        assert per_sbh(fp8("tensorwise", kernels=kernels)) == 23
    assert per_sbh(fp8("rowwise")) == 23  # torchao's recipe


def test_gelu_fc2_input_in_fp8():
    gelu = dataclasses.replace(LLAMA, ffn="gelu", ffn_hidden=4 * H, norm="layernorm")
    # GeLU's literal 16 = GeLU input 8 + fc2 input 8 -> 8 + 4
    assert per_sbh(gelu) == 8 + 6 + 16
    assert per_sbh(dataclasses.replace(gelu, dtype="fp8")) == 8 - 2 + 6 + 1 + 16 - 4


def test_the_explicit_cache_key_keeps_its_own_rule():
    cache = activation_bytes_per_layer(fp8("delayed"), Layout(fp8_activation_cache=True))
    # DeepSeek-V3's rule: proj's input in E5M6 (-0.5), no extra copy
    assert cache / SBH == 23 - 2 - 1.5 - 0.5
