"""Blackwell's non-TN FP8 GEMM layouts (`ModelSpec.fp8_non_tn`, `traces.fp8_recipes` section
"Non-TN"): delayed and tensorwise write the row-wise FP8 copy only (TE allocates no transpose
where nvte_is_non_tn_fp8_gemm_supported()), every other recipe casts as on Hopper; the flag
follows the accelerator, is never a config key, and rides the trace header."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sim.config import experiment_from_dict, resolve_non_tn
from sim.search.analytic import Analytic
from sim.whatif.capture import model_table
from tests.traces.test_fp8_recipes import (
    AMAX,
    CAST,
    FUSED,
    GRAD,
    LLAMA,
    SHAPES,
    B,
    T,
    around,
    expected,
    model,
)
from topology import build_cluster
from traces import io
from traces.errors import ConfigError
from traces.fp8 import weight_cast_bytes
from traces.header import TraceMeta
from traces.header_json import meta_from_json, meta_to_json
from traces.kernels import layer_kernels
from traces.model import ModelSpec
from traces.moe import expert_casts
from traces.purpose import Kernel

K = Kernel


def non_tn(recipe: str) -> ModelSpec:
    return dataclasses.replace(model(recipe), fp8_non_tn=True)


def expected_non_tn(recipe: str, a: int, w: int, c: int, fused: bool, sp: bool):
    """(before, after) the GEMM as `test_fp8_recipes.expected`, with one FP8 copy written:
    X read 2a, write a (not 2a); dY read 2c, write c; no transpose of the gathered input;
    behind a delayed LayerNormLinear's norm (which writes X's row-wise copy) no cast at all."""
    shard = T if fused and sp else 1
    if recipe == "delayed":
        return ([] if fused else [(CAST, 3 * a, 0)]), [(GRAD, 0, 3 * c)]
    return ([(AMAX, 2 * a / shard, 0), (CAST, 3 * a / shard, 0)],
            [(GRAD, 0, 3 * c), (AMAX, 0, 2 * c)])


def rows(pair):
    return [[(k, pytest.approx(f), pytest.approx(b)) for k, f, b in side] for side in pair]


@pytest.mark.parametrize("sp", [True, False])
@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_per_tensor_casts_write_the_row_wise_copy_only(recipe, sp):
    kernels = layer_kernels(non_tn(recipe), B, T, sp)
    for gemm, (a, w, c) in SHAPES.items():
        fused = gemm in FUSED
        assert list(around(kernels, gemm)) == rows(expected_non_tn(recipe, a, w, c, fused, sp))


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_without_non_tn_the_per_tensor_casts_are_hopper_s(recipe):
    """The cast-transpose (read 2a, write 2a) and the gathered input's transpose stay."""
    kernels = layer_kernels(model(recipe), B, T, True)
    for gemm, (a, w, c) in SHAPES.items():
        assert list(around(kernels, gemm)) == rows(expected(recipe, a, w, c, gemm in FUSED))


@pytest.mark.parametrize("sp", [True, False])
@pytest.mark.parametrize("recipe", ["rowwise", "blockwise", "mxfp8"])
def test_block_and_row_scales_cast_as_on_hopper(recipe, sp):
    assert layer_kernels(non_tn(recipe), B, T, sp) == layer_kernels(model(recipe), B, T, sp)


@pytest.mark.parametrize(("recipe", "hopper", "blackwell"), [
    ("delayed", 2 + 2, 2 + 1), ("tensorwise", 2 + 2 + 2, 2 + 2 + 1), ("rowwise", 0, 0),
    ("blockwise", 2 + 2 * (1 + 4 / 128**2), 2 + 2 * (1 + 4 / 128**2)),
    ("mxfp8", 2 + 2 * (1 + 1 / 32), 2 + 2 * (1 + 1 / 32))])
def test_the_steps_weight_cast_writes_one_copy_for_per_tensor_scales(recipe, hopper, blackwell):
    per = weight_cast_bytes(model(recipe), range(2), 2) / hopper if hopper else 0.0
    assert weight_cast_bytes(non_tn(recipe), range(2), 2) == pytest.approx(blackwell * per)


def test_an_experts_casts_write_one_copy_for_per_tensor_scales():
    moe = dataclasses.replace(LLAMA, experts=8, top_k=2, moe_ffn_hidden=32)
    rows_, n, k = 40, 64, 32
    for recipe, fwd, bwd in (("delayed", 3, 3), ("tensorwise", 2 + 3, 3 + 2)):
        m = dataclasses.replace(moe, fp8_recipe=recipe)
        hopper = expert_casts(m, rows_, n, k, 2)
        casts = expert_casts(dataclasses.replace(m, fp8_non_tn=True), rows_, n, k, 2)
        assert hopper is not None and casts is not None
        assert (casts[0].mem_bytes, casts[1].bwd_bytes) == (fwd * rows_ * k, bwd * rows_ * n)
        assert (hopper[0].mem_bytes - casts[0].mem_bytes,
                hopper[1].bwd_bytes - casts[1].bwd_bytes) == (rows_ * k, rows_ * n)


def job(preset: str, **model_keys: object) -> dict:
    return {"model": {"layers": 4, "hidden": 256, "heads": 16, "seq_len": 128, "vocab": 1024,
                      **model_keys},
            "parallel": {"tp": 2, "dp": 4, "global_batch": 8},
            "cluster": {"preset": preset, "nodes": 1}}


@pytest.mark.parametrize(("preset", "dtype", "recipe", "want"), [
    ("dgx-h100", "fp8", "delayed", False), ("dgx-h100", "fp8", "tensorwise", False),
    ("dgx-b200", "fp8", "delayed", True), ("dgx-b200", "fp8", "tensorwise", True),
    ("dgx-b200", "fp8", None, False), ("dgx-b200", "fp8", "blockwise", False),
    ("dgx-b200", "fp8", "rowwise", False), ("dgx-b200", "fp4", None, False),
    ("dgx-b200", "bf16", None, False)])
def test_the_config_derives_it_from_the_accelerator(preset, dtype, recipe, want):
    """True on Blackwell for the per-tensor recipes only, the ones it changes (the default
    there is MXFP8), so no other model's trace header carries it."""
    keys = {"dtype": dtype, **({"fp8_recipe": recipe} if recipe else {})}
    exp = experiment_from_dict(job(preset, **keys))
    assert exp.model.fp8_non_tn is want
    assert dataclasses.replace(exp.model, fp8_non_tn=False) == \
        resolve_non_tn(exp.model, build_cluster("dgx-h100", nodes=1).accelerator)


def test_a_config_cannot_state_it():
    with pytest.raises(ConfigError, match="model.fp8_non_tn: not a config key"):
        experiment_from_dict(job("dgx-h100", dtype="fp8", fp8_non_tn=True))


def test_a_model_built_for_one_accelerator_is_corrected_for_another():
    """An Experiment or the analytic search given a model as built elsewhere sets the flag
    from its own cluster's accelerator."""
    b200 = experiment_from_dict(job("dgx-b200", dtype="fp8", fp8_recipe="delayed"))
    h100 = experiment_from_dict(job("dgx-h100", dtype="fp8", fp8_recipe="delayed"))
    moved = dataclasses.replace(b200, model=h100.model)
    assert moved.model == b200.model and moved.model.fp8_non_tn
    assert Analytic(h100.model, b200.cluster, b200.profile).model.fp8_non_tn
    assert not Analytic(b200.model, h100.cluster, h100.profile).model.fp8_non_tn


def test_only_an_fp8_model_takes_it():
    for dtype in ("bf16", "fp4"):
        with pytest.raises(ConfigError, match="model.fp8_non_tn"):
            dataclasses.replace(LLAMA, dtype=dtype, fp8_recipe="", fp8_non_tn=True)
    with pytest.raises(ConfigError, match="model.fp8_non_tn"):
        dataclasses.replace(LLAMA, fp8_non_tn=1)


def test_the_trace_header_carries_it_and_a_capture_does_not_state_it():
    meta = TraceMeta(model=non_tn("delayed"))
    written = meta_to_json(meta)
    assert written["model"]["fp8_non_tn"] is True
    assert meta_from_json(json.loads(json.dumps(written)), io.VERSION) == meta
    assert "fp8_non_tn" not in meta_to_json(TraceMeta(model=model("delayed")))["model"]
    assert "fp8_non_tn" not in model_table(non_tn("delayed"))
