"""NVFP4 (`dtype = "fp4"`, TE's NVFP4BlockScaling): the quantize kernels and their bytes by
hand, the GEMM at the accelerator's dense FP4 rate, the weight cast, the saved inputs and cached
weights at 4.5 bits, the TP amax reduction, MFU against the FP4 peak."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sim.cli import main
from sim.models.compute import ComputeModel
from sim.models.fp8_weight_cache import cache_bytes_per_weight
from sim.models.host import expert_cast_launches
from sim.profile import default_profile
from tests.sim.models.test_fp8 import CONFIG
from topology.presets import B200, B300, GB200, GB300, H100_SXM
from traces.errors import ConfigError
from traces.fp8 import fp8_gemm_rate, fp8_linear, fp8_weights_per_layer, recipe, weight_cast_bytes
from traces.fp8_params import check_fp8_param_gather
from traces.fp8_recipes import NVFP4_GEMM_RATE, RECIPES
from traces.kernels import layer_kernels
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe import expert_casts
from traces.ops import OpKind, Phase
from traces.plan import build
from traces.purpose import AmaxReduction, Kernel, KernelRun
from traces.te_fp8_memory import te_fp8_terms

FP4 = ModelSpec(layers=4, hidden=64, heads=4, kv_heads=2, seq_len=32, vocab=128, ffn="swiglu",
                ffn_hidden=96, norm="rmsnorm", position="rope", bias=False, dtype="fp4")
Q = 0.5 + 1 / 16
"""An E2M1 value (half a byte) and its share of an E4M3 scale per 16 values: 4.5 bits."""


def test_fp4_takes_the_nvfp4_recipe_and_keeps_bf16_storage():
    assert FP4.fp4_recipe == "nvfp4" and FP4.fp8_recipe == "" and FP4.fp8 and FP4.fp4
    assert FP4.data_dtype == "bf16" and FP4.dtype_bytes == 2
    rec = recipe(FP4)
    assert rec is RECIPES["nvfp4"] and rec.q_act == rec.q_weight == Q == 0.5625
    assert rec.cast_kernels == 3 and fp8_gemm_rate(FP4) == NVFP4_GEMM_RATE


def test_an_nvfp4_linear_by_hand():
    """X's amax (with the Hadamard amax), row-wise cast, column-wise Hadamard cast; the GEMM on
    4.5-bit operands; dY's casts (stochastic: a random word per 4 values) in backward order."""
    m, n, k, g = 64, 48, 32, 4
    a, c = m * k, m * n
    kernels = fp8_linear(FP4, Kernel.FC2, (1, m, n, k), g)
    assert [kw.name for kw in kernels] == [
        Kernel.FP8_AMAX, Kernel.FP8_CAST, Kernel.FP8_CAST, Kernel.FC2,
        Kernel.FP8_CAST_GRAD, Kernel.FP8_CAST_GRAD, Kernel.FP8_AMAX]
    amax, row, col, gemm, col_grad, row_grad, amax_grad = kernels
    rht = 2 * 16  # FLOPs a value: a 16x16 matrix on each 16-value block
    assert (amax.flops, amax.mem_bytes, amax.bwd_bytes) == (rht * a, 2 * a, 0)
    assert (row.flops, row.mem_bytes) == (0, (2 + Q) * a)
    assert (col.flops, col.mem_bytes) == (rht * a, (2 + Q) * a)
    assert gemm.fp8 and gemm.fp4 and gemm.flops == 2 * m * n * k
    assert gemm.mem_bytes == Q * (m * k + k * n) + 2 * m * n
    assert gemm.bwd_bytes == Q * (m * n + k * n) + 2 * m * k + Q * (m * k + m * n) + 2 * k * n * g
    # backward runs the list reversed: dY's amax, its row-wise cast, its Hadamard cast
    assert (amax_grad.bwd_flops, amax_grad.bwd_bytes, amax_grad.mem_bytes) == (rht * c, 2 * c, 0)
    assert (row_grad.bwd_flops, row_grad.bwd_bytes, row_grad.bwd_draws) == (0, (2 + Q) * c, c / 4)
    assert (col_grad.bwd_flops, col_grad.bwd_bytes, col_grad.bwd_draws) == \
        (rht * c, (2 + Q) * c, c / 4)


def test_the_norm_is_not_fused_and_every_linear_is_quantized():
    """TE's normalization runs unfused for an NVFP4 quantizer with RHT: the norms write bf16,
    and each of the four linears is preceded by its three quantize kernels."""
    kernels = layer_kernels(FP4, 1, 1, False)
    bf16 = layer_kernels(dataclasses.replace(FP4, dtype="bf16", fp4_recipe=""), 1, 1, False)
    norm = {k.name: k for k in kernels if k.name in (Kernel.LN1, Kernel.LN2)}
    assert norm == {k.name: k for k in bf16 if k.name in (Kernel.LN1, Kernel.LN2)}
    names = [k.name for k in kernels]
    assert sorted(k.name for k in kernels if k.fp4) == sorted(
        [Kernel.QKV, Kernel.PROJ, Kernel.FC1, Kernel.FC2])
    for gemm in (Kernel.QKV, Kernel.PROJ, Kernel.FC1, Kernel.FC2):
        i = names.index(gemm)
        assert names[i - 3:i] == [Kernel.FP8_AMAX, Kernel.FP8_CAST, Kernel.FP8_CAST]
        assert names[i + 1:i + 4] == [Kernel.FP8_CAST_GRAD, Kernel.FP8_CAST_GRAD, Kernel.FP8_AMAX]
    assert names.count(Kernel.FP8_AMAX) == 8  # X's and dY's of 4 GEMMs


def test_the_weight_cast_reads_twice_and_writes_both_nvfp4_copies():
    """Once a step: nvte_compute_amax (2w), then one quantize writing both copies (2w, 2qw)."""
    elements = fp8_weights_per_layer(FP4, 0, 2) + fp8_weights_per_layer(FP4, 1, 2)
    assert elements == 2 * (64 * (64 + 2 * 32) + 64 * 64 + 64 * 192 + 96 * 64) / 2
    assert weight_cast_bytes(FP4, range(2), 2) == elements * (2 + 2 + 2 * Q)


def test_fp4_gemms_run_at_the_fp4_peak():
    """Dense FP4 from the spec sheets: HGX B200 18 PF and GB200 20 PF a GPU with sparsity,
    DGX B300 108 PF dense for 8, GB300 NVL72 1,080 PF dense for 72."""
    assert (B200.peak_flops_fp4, GB200.peak_flops_fp4) == (9e15, 10e15)
    assert (B300.peak_flops_fp4, GB300.peak_flops_fp4) == (13.5e15, 15e15)
    assert H100_SXM.peak_flops_fp4 == 0
    compute = ComputeModel(GB300, default_profile(GB300))
    assert compute.peak("fp4") == GB300.sustained_flops_fp4 == \
        GB300.peak_flops_fp4 * GB300.sustained_clock_MHz / GB300.peak_clock_MHz
    shape = (1, 8192, 8192, 8192)
    bf16 = compute.gemm_time(shape, 0.7)
    fp4 = compute.gemm_time(shape, 0.7, compute.peak("fp4"))
    assert fp4 == pytest.approx(bf16 * GB300.peak_flops / GB300.peak_flops_fp4)  # 1/6
    # the op's time against the FP4 roof is an FP8 op's on a chip whose FP8 roof were FP4's
    gemm = fp8_linear(FP4, Kernel.FC1, (1, 8192, 8192, 8192), 2)[3]
    as_fp8 = dataclasses.replace(GB300, peak_flops_fp8=GB300.peak_flops_fp4)
    other = ComputeModel(as_fp8, default_profile(GB300))
    for backward in (False, True):
        flops, size = (gemm.bwd_flops, gemm.bwd_bytes) if backward else (gemm.flops,
                                                                          gemm.mem_bytes)
        assert compute.kernel_time("fc1", flops, size, gemm.gemm, backward=backward,
                                   fp8="fp4") == \
            other.kernel_time("fc1", flops, size, gemm.gemm, backward=backward, fp8=True)


def test_nvfp4_gemms_run_at_te_s_measured_fraction_of_the_fp4_peak():
    """TE@8f2e635 gemm_profiling.rst on B300, pre-quantized: 6.812 ms a layer's GEMMs with
    per-tensor FP8, 3.764 ms in NVFP4; at the FP4 rate (3x FP8's on B300: 13.5 against 4.5 PF)
    they would take 6.812 / 3."""
    assert B300.peak_flops_fp4 / B300.peak_flops_fp8 == 3
    assert NVFP4_GEMM_RATE == 6.812 / 3 / 3.764 and round(NVFP4_GEMM_RATE, 4) == 0.6033
    full = ComputeModel(GB300, default_profile(GB300))
    rated = ComputeModel(GB300, default_profile(GB300), fp8_rate=fp8_gemm_rate(FP4))
    assert rated.peak("fp4") == full.peak("fp4") * NVFP4_GEMM_RATE
    shape = (1, 8192, 8192, 8192)
    assert rated.gemm_time(shape, 0.7, rated.peak("fp4")) == \
        pytest.approx(full.gemm_time(shape, 0.7, full.peak("fp4")) / NVFP4_GEMM_RATE)


def test_the_plan_runs_fp4_gemms_and_reduces_both_amaxes_over_tp():
    """SP at tp 2: before each gathered input's and output gradient's casts, TE all-reduces
    the row-wise and the Hadamard amax together (8 bytes); no delayed-scaling reductions."""
    layout = Layout(tp=2, pp=2, dp=2, global_batch=4, sp=True)
    ops = build(FP4, layout).ops[0]  # pp rank 0: layers 0 and 1
    gemms = [op for op in ops if op.dtype == "fp4"]
    assert {op.name for op in gemms} == {"qkv", "proj", "fc1", "fc2"}
    assert not [op for op in ops if op.dtype == "fp8"]
    compute = ComputeModel(B200, default_profile(B200))
    for op in gemms[:4]:  # timed against the FP4 roof
        assert compute.duration(op) == compute.kernel_time(
            op.name, op.flops, op.mem_bytes, op.gemm, backward=op.phase is Phase.BWD,
            fp8="fp4")
    amax = [op for op in ops if isinstance(op.purpose, AmaxReduction)]
    m = layout.num_microbatches
    # per micro-batch and layer: qkv's and fc1's input forward, proj's and fc2's dY backward
    assert len(amax) == 2 * 2 * 2 * m
    assert all(op.size_bytes == 8 and op.kind is OpKind.ALL_REDUCE and op.group == (0, 1)
               for op in amax)
    casts = [op for op in ops if op.purpose == KernelRun(Kernel.FP8_WEIGHT_CAST)]
    assert len(casts) == 1 and casts[0].phase is Phase.OPT
    assert casts[0].mem_bytes == weight_cast_bytes(FP4, range(2), 2)


def test_saved_inputs_and_cached_weights_take_4_5_bits():
    """TE keeps one NVFP4 copy of each saved linear input (2 - q spared a value against bf16)
    and both NVFP4 copies of each weight between micro-batches."""
    replicated, split, _ = te_fp8_terms(FP4, Layout(global_batch=1))
    assert replicated == 2 * (2 - Q)
    proj = FP4.q_width / FP4.hidden
    assert split == FP4.ffn_hidden / FP4.hidden * (2 - Q) - proj * Q
    assert cache_bytes_per_weight(FP4, non_tn=True) == 2 * Q


def test_an_expert_cast_launches_three_kernels_an_expert():
    moe = dataclasses.replace(FP4, experts=8, top_k=2, moe_ffn_hidden=32)
    assert expert_cast_launches(moe, Layout(ep=2, dp=2, global_batch=2)) == 4 * 3


def test_mfu_is_against_the_fp4_peak(capsys, tmp_path):
    runs = {}
    for dtype in ("fp4", "bf16"):
        path = tmp_path / f"{dtype}.toml"
        path.write_text(CONFIG.format(dtype=dtype, preset="dgx-b200", nodes=1, extra=""))
        assert main(["simulate", str(path), "--json"]) == 0
        runs[dtype] = json.loads(capsys.readouterr().out)
    for dtype, peak in (("fp4", B200.peak_flops_fp4), ("bf16", B200.peak_flops)):
        run = runs[dtype]
        assert run["mfu"] == pytest.approx(run["model_tflops_per_gpu"] * 1e12 / peak)
    fp4, bf16 = runs["fp4"], runs["bf16"]
    assert fp4["model_tflops_per_gpu"] * fp4["step_time_s"] == \
        pytest.approx(bf16["model_tflops_per_gpu"] * bf16["step_time_s"])  # the same model


def test_fp8_param_gather_is_refused_with_nvfp4():
    """Megatron-Bridge's bf16_with_nvfp4_mixed sets fp8_param_gather False: FP8 primary
    weights are not NVFP4's."""
    layout = Layout(dp=2, zero=1, fp8_param_gather=True, global_batch=2)
    with pytest.raises(ConfigError, match="parallel.fp8_param_gather: true needs Transformer "
                                          "Engine's FP8 weights"):
        check_fp8_param_gather(FP4, layout)


def test_an_expert_cast_carries_the_hadamard_flops_and_the_rounding_draws():
    moe = dataclasses.replace(FP4, experts=8, top_k=2, moe_ffn_hidden=32)
    rows, n, k, experts = 96, 32, 64, 4
    a, c = rows * k, rows * n
    casts = expert_casts(moe, rows, n, k, experts)
    assert casts is not None
    fwd, bwd = casts
    assert (fwd.name, fwd.flops, fwd.mem_bytes) == (Kernel.EXPERT_CAST, 64 * a, (6 + 2 * Q) * a)
    assert (bwd.name, bwd.bwd_flops, bwd.bwd_bytes, bwd.bwd_draws) == \
        (Kernel.EXPERT_CAST_GRAD, 64 * c, (6 + 2 * Q) * c, c / 2)
