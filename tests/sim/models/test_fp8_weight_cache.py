"""Transformer Engine's cached FP8 weights (issue 32, `sim.models.fp8_weight_cache`), held
all step beside the bf16 weights, exact, on a small Llama-shaped model (h 64, 4 heads of 16,
2 KV heads, SwiGLU f 96, RMSNorm, no biases): a layer's weights h(q + 2kv) + qh + 2fh + fh =
64·128 + 64·64 + 64·192 + 96·64 = 30,720 split by TP, and its two norms' 128 replicated."""

from __future__ import annotations

import dataclasses

import pytest

from sim.models.fp8_weight_cache import cache_bytes_per_weight
from sim.models.memory import memory_timeline, pp_rank_memory
from traces.layout import Layout
from traces.model import ModelSpec
from traces.pipeline import layout_schedule

LLAMA = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, seq_len=32, vocab=128,
                  ffn="swiglu", ffn_hidden=96, norm="rmsnorm", position="rope", bias=False,
                  dropout=0.0)
LAYER = 30_720 + 128
"""One layer's parameters at TP 1 (module docstring)."""


def fp8(recipe: str, **over: object) -> ModelSpec:
    return dataclasses.replace(LLAMA, dtype="fp8", fp8_recipe=recipe, **over)


def extra(model: ModelSpec, non_tn: bool = False, pp_rank: int = 0, **layout: object) -> float:
    """Working bytes beyond the bf16 model's on the same layout, its params unchanged."""
    lay = Layout(**layout)
    fp8_mem, bf16_mem = (pp_rank_memory(m, lay, pp_rank, [], non_tn=non_tn)
                         for m in (model, LLAMA))
    assert fp8_mem.params_bytes == bf16_mem.params_bytes  # a workspace, not checkpointed
    return fp8_mem.working_bytes - bf16_mem.working_bytes


def test_layer_params_are_the_docstrings():
    assert LLAMA.layer_params(1) == LAYER
    assert LLAMA.layer_params(2) == 30_720 / 2 + 128


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_per_tensor_scaling_on_hopper_keeps_the_data_and_its_transpose(recipe):
    assert extra(fp8(recipe)) == 2 * 2 * LAYER


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_per_tensor_scaling_on_blackwell_keeps_one_copy(recipe):
    assert extra(fp8(recipe), non_tn=True) == 2 * 1 * LAYER


@pytest.mark.parametrize("non_tn", [False, True])
def test_mxfp8_keeps_both_copies_with_a_scale_byte_per_32(non_tn):
    assert cache_bytes_per_weight(fp8("mxfp8"), non_tn) == 2 * (1 + 1 / 32)
    assert extra(fp8("mxfp8"), non_tn=non_tn) == pytest.approx(2 * 2 * (1 + 1 / 32) * LAYER)


def test_blockwise_keeps_both_copies_with_a_128x128_blocks_fp32_scale():
    assert cache_bytes_per_weight(fp8("blockwise"), False) == 2 * (1 + 4 / 128**2)
    assert extra(fp8("blockwise")) == pytest.approx(2 * 2 * (1 + 4 / 128**2) * LAYER)


@pytest.mark.parametrize("model", [
    fp8("rowwise"),                        # torchao's rowwise casts per use
    fp8("tensorwise", kernels="compiled"),  # torchao's tensorwise, compiled or eager
    fp8("delayed", kernels="eager"),
])
def test_torchao_caches_no_weight(model):
    assert extra(model) == 0


def test_zero3_and_deepseeks_own_rule_add_nothing():
    assert extra(fp8("delayed"), dp=2, zero=3, global_batch=2) == 0
    assert extra(fp8("blockwise"), fp8_activation_cache=True) == 0


def test_zero_does_not_shard_the_cache_and_tp_pp_split_it():
    # ZeRO 1 over 4 ranks shards the optimizer, not the copy each rank casts
    assert extra(fp8("delayed"), dp=4, zero=1, global_batch=4) == 2 * 2 * LAYER
    # TP 2, PP 2: one layer a rank at its TP share; embedding and head are not TE's
    for rank in (0, 1):
        assert extra(fp8("delayed"), pp_rank=rank, tp=2, pp=2) == 2 * (30_720 / 2 + 128)


def test_the_timeline_peak_counts_the_cache_as_the_breakdown_does():
    layout = Layout(pp=2, global_batch=4)
    model = fp8("mxfp8")
    schedule = layout_schedule(layout)
    for rank in (0, 1):
        timed = [(a, float(i), i + 1.0) for i, a in enumerate(schedule[rank])]
        peak = max(b for _, b in memory_timeline(model, layout, rank, timed, non_tn=True))
        want = pp_rank_memory(model, layout, rank, schedule[rank], non_tn=True).total_bytes
        assert peak == pytest.approx(want)
