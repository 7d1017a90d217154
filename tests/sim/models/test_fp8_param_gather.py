"""Megatron-Core's `fp8_param_gather` (issue 32, `traces.fp8_params`): TE's linear weights are
FP8 parameters (no bf16 copy, no separate workspace) and the distributed optimizer gathers
them at one byte an element (MXFP8: at bf16, in the gradient buffer). The small Llama-shaped
model of `test_fp8_weight_cache`: two layers of 30,848 parameters, the embedding 128 x 64 (tied
to the output layer) and the final norm's 64."""

from __future__ import annotations

import dataclasses

import pytest

from sim.models.memory import pp_rank_memory
from traces.errors import ConfigError
from traces.fp8_params import check_fp8_param_gather, param_gather_bytes
from traces.layout import Layout
from traces.model import ModelSpec
from traces.plan import build
from traces.purpose import ExpertParamGather, ParamGather

LLAMA = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, seq_len=32, vocab=128,
                  ffn="swiglu", ffn_hidden=96, norm="rmsnorm", position="rope", bias=False,
                  dropout=0.0)
LAYERS = 2 * (30_720 + 128)
ALL = LAYERS + 128 * 64 + 64
ZERO1 = Layout(dp=2, zero=1, global_batch=2, fp8_param_gather=True)


def fp8(recipe: str, **over: object) -> ModelSpec:
    return dataclasses.replace(LLAMA, dtype="fp8", fp8_recipe=recipe, **over)


def test_the_counts_are_the_docstrings():
    assert LLAMA.params_on_stages([0], 1, 1) == ALL


@pytest.mark.parametrize(("recipe", "non_tn", "per_weight"), [
    ("tensorwise", False, 2.0),  # Hopper: FP8 data and its transpose, as many bytes as bf16
    ("delayed", True, 1.0),      # Blackwell: the data alone
    ("mxfp8", True, 2 * (1 + 1 / 32)),
])
def test_the_fp8_parameter_replaces_the_bf16_weight_and_the_workspace(recipe, non_tn,
                                                                      per_weight):
    plain = dataclasses.replace(ZERO1, fp8_param_gather=False)
    bf16 = pp_rank_memory(LLAMA, plain, 0, [], non_tn=non_tn)
    gathered = pp_rank_memory(fp8(recipe), ZERO1, 0, [], non_tn=non_tn)
    assert gathered.working_bytes == bf16.working_bytes
    assert gathered.params_bytes == pytest.approx(bf16.params_bytes
                                                  + (per_weight - 2) * LAYERS)


@pytest.mark.parametrize(("recipe", "gathered"), [
    ("tensorwise", 1.0), ("delayed", 1.0), ("blockwise", 1 + 4 / 128**2), ("mxfp8", 2.0)])
def test_gather_bytes_per_parameter(recipe, gathered):
    want = (LAYERS * gathered + (ALL - LAYERS) * 2) / ALL
    assert param_gather_bytes(fp8(recipe), ZERO1, 0) == pytest.approx(want)
    plain = dataclasses.replace(ZERO1, fp8_param_gather=False)
    assert param_gather_bytes(fp8(recipe), plain, 0) == 2


def test_the_plans_parameter_gathers_move_those_bytes():
    def gathered(layout: Layout) -> float:
        ops = build(fp8("tensorwise"), layout).ops[0]
        return sum(op.size_bytes for op in ops if isinstance(op.purpose, ParamGather))
    plain = dataclasses.replace(ZERO1, fp8_param_gather=False)
    assert gathered(plain) > 0
    ratio = (LAYERS * 1 + (ALL - LAYERS) * 2) / (ALL * 2)
    assert gathered(ZERO1) == pytest.approx(gathered(plain) * ratio)


@pytest.mark.parametrize(("model", "layout", "rule"), [
    (LLAMA, ZERO1, "needs Transformer Engine's FP8 weights"),
    (fp8("rowwise"), ZERO1, "needs Transformer Engine's FP8 weights"),
    (fp8("delayed", kernels="compiled"), ZERO1, "needs Transformer Engine's FP8 weights"),
    (fp8("delayed"), Layout(fp8_param_gather=True), "needs zero = 1 or 2"),
    (fp8("delayed"), dataclasses.replace(ZERO1, zero=3), "needs zero = 1 or 2"),
])
def test_refused_in_one_line_where_megatron_has_no_fp8_weights(model, layout, rule):
    with pytest.raises(ConfigError, match=rule) as err:
        check_fp8_param_gather(model, layout)
    assert str(err.value).startswith("parallel.fp8_param_gather: true ")
    assert "\n" not in str(err.value)


def test_the_routed_experts_gather_in_fp8_too():
    moe = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, ffn="swiglu",
                    ffn_hidden=96, experts=4, top_k=2, moe_ffn_hidden=32, bias=False,
                    norm="rmsnorm", position="rope", dtype="fp8", fp8_recipe="delayed")
    layout = Layout(dp=4, ep=2, zero=1, global_batch=4)

    def gathered(lay: Layout) -> list[float]:
        return [op.size_bytes for op in build(moe, lay).ops[0]
                if isinstance(op.purpose, ExpertParamGather)]
    plain = gathered(layout)
    assert plain and plain == [4 / 2 * 3 * 64 * 32 * 2] * 2  # E/ep SwiGLU experts, bf16
    assert gathered(dataclasses.replace(layout, fp8_param_gather=True)) == [p / 2 for p in plain]
