"""FP8 recipes (issue 32, item 3): per recipe, the casts one layer launches, counted, with their
bytes by the formulas of `traces.fp8_recipes`' docstring written out again here; the weight
cast; the amax all-reduces of the plan (count, bytes, group)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from traces.fp8 import fp8_weights_per_layer, weight_cast_bytes
from traces.kernels import layer_kernels
from traces.layout import Layout
from traces.model import ModelSpec
from traces.plan import build
from traces.purpose import AmaxReduction, Kernel, KernelRun

K = Kernel
LLAMA = ModelSpec(layers=4, hidden=64, heads=4, kv_heads=2, seq_len=32, vocab=128,
                  ffn="swiglu", ffn_hidden=96, norm="rmsnorm", position="rope", bias=False,
                  dtype="fp8")
RECIPES = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8")
B, T = 1, 2  # one sample, TP 2 with SP: norms on 16 of the 32 tokens, GEMMs on all 32
M, N_NORM = 32, 16 * 64
# (X elements a, W elements w, dY elements c) of each linear on one TP rank:
# qkv (K 64, N (64 + 2·32)/2), proj (K 4·16/2, N 64), fc1 (K 64, N 2·96/2), fc2 (K 96/2, N 64)
SHAPES = {K.QKV: (M * 64, 64 * 64, M * 64), K.PROJ: (M * 32, 32 * 64, M * 64),
          K.FC1: (M * 64, 64 * 96, M * 96), K.FC2: (M * 48, 48 * 64, M * 64)}
FUSED = {K.QKV, K.FC1}  # behind ln1 and ln2 (TE's LayerNormLinear)
CAST, GRAD, AMAX = K.FP8_CAST, K.FP8_CAST_GRAD, K.FP8_AMAX
MX, BLOCK_ACT, BLOCK_W = 1 + 1 / 32, 1 + 4 / 128, 1 + 4 / 128**2


def model(recipe: str) -> ModelSpec:
    return dataclasses.replace(LLAMA, fp8_recipe=recipe)


def expected(recipe: str, a: int, w: int, c: int, fused: bool
             ) -> tuple[list[tuple[Kernel, float, float]], list[tuple[Kernel, float, float]]]:
    """(before, after) the GEMM, forward order: (kernel, forward bytes, backward bytes).
    `fused`: qkv and fc1, whose input SP gathers from T ranks: where TE quantizes before the
    gather, X's casts run over the a/T shard; per-tensor scales cast it row-wise only and
    transpose the gathered copy in backward (read a, write a), after dY's casts."""
    if recipe == "delayed":  # cast-transpose; behind a fused norm (gathered), the transpose
        if fused:  # the norm wrote the shard's FP8 row-wise copy
            return [], [(CAST, 0, 2 * a), (GRAD, 0, 4 * c)]
        return [(CAST, 4 * a, 0)], [(GRAD, 0, 4 * c)]
    if recipe == "tensorwise":  # an amax pass, then the cast-transpose
        if fused:
            return ([(AMAX, 2 * a / T, 0), (CAST, 3 * a / T, 0)],
                    [(CAST, 0, 2 * a), (GRAD, 0, 4 * c), (AMAX, 0, 2 * c)])
        return [(AMAX, 2 * a, 0), (CAST, 4 * a, 0)], [(GRAD, 0, 4 * c), (AMAX, 0, 2 * c)]
    if recipe == "rowwise":  # X, W along K forward; X, W, dY along the other axis backward
        return ([(CAST, 3 * a, 0), (CAST, 3 * w, 0)],
                [(CAST, 0, 3 * a), (AMAX, 0, 2 * a), (CAST, 0, 3 * w), (AMAX, 0, 2 * w),
                 (GRAD, 0, 3 * c), (AMAX, 0, 2 * c), (GRAD, 0, 3 * c)])
    q = BLOCK_ACT if recipe == "blockwise" else MX
    shard = T if fused and recipe == "mxfp8" else 1  # TE gathers blockwise in bf16
    return [(CAST, (2 + 2 * q) * a / shard, 0)], [(GRAD, 0, (2 + 2 * q) * c)]


def around(kernels, gemm: Kernel):
    """The FP8 kernels just before and just after `gemm` in `kernels`."""
    names = [k.name for k in kernels]
    at = names.index(gemm)
    fp8 = {CAST, GRAD, AMAX}
    start = at
    while start > 0 and names[start - 1] in fp8:
        start -= 1
    end = at + 1
    while end < len(names) and names[end] in fp8:
        end += 1
    row = [(k.name, k.mem_bytes, k.bwd_bytes) for k in kernels]
    return row[start:at], row[at + 1:end]


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_linear_launches_its_recipes_casts(recipe):
    kernels = layer_kernels(model(recipe), B, T, True)
    for gemm, (a, w, c) in SHAPES.items():
        got, want = around(kernels, gemm), expected(recipe, a, w, c, gemm in FUSED)
        for have, should in zip(got, want, strict=True):  # before the GEMM, then after it
            assert [k for k, *_ in have] == [k for k, *_ in should], gemm
            assert [x for _, *b in have for x in b] == \
                pytest.approx([x for _, *b in should for x in b]), gemm


@pytest.mark.parametrize(("recipe", "counts"), [
    ("delayed", {CAST: 4, GRAD: 4}),
    ("tensorwise", {AMAX: 8, CAST: 6, GRAD: 4}),  # + the gathered qkv and fc1 inputs' transposes
    ("rowwise", {CAST: 16, AMAX: 12, GRAD: 8}),
    ("blockwise", {CAST: 4, GRAD: 4}),
    ("mxfp8", {CAST: 4, GRAD: 4}),
])
def test_the_casts_of_one_layer_counted(recipe, counts):
    kernels = layer_kernels(model(recipe), B, T, True)
    assert Counter(k.name for k in kernels if k.name in {CAST, GRAD, AMAX}) == counts


@pytest.mark.parametrize(("recipe", "write"), [
    ("delayed", 1.0), ("tensorwise", 2.0), ("rowwise", 2.0), ("blockwise", 2.0),
    ("mxfp8", 2.0)])
def test_a_layernormlinear_norm_writes_fp8_where_te_fuses_it(recipe, write):
    """ln1 and ln2 read x (2 bytes) and write their output: bf16, or FP8 where TE's norm
    quantizes itself (delayed, its rowwise copy); TE's normalization.cpp runs the norm
    unfused for current, block and (by default) MXFP8 scaling."""
    ks = {k.name: k for k in layer_kernels(model(recipe), B, T, True)}
    for norm in (K.LN1, K.LN2):
        assert ks[norm].mem_bytes == pytest.approx((2 + write) * N_NORM)
        assert ks[norm].bwd_bytes == 6 * 2 * N_NORM  # the backward is bf16's


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_gemm_reads_its_operands_at_the_recipes_bytes(recipe):
    qa = {"blockwise": BLOCK_ACT, "mxfp8": MX}.get(recipe, 1.0)
    qw = {"blockwise": BLOCK_W, "mxfp8": MX}.get(recipe, 1.0)
    ks = {k.name: k for k in layer_kernels(model(recipe), B, T, True)}
    a, w, c = SHAPES[K.FC2]
    assert ks[K.FC2].fp8 and ks[K.FC2].mem_bytes == pytest.approx(qa * a + qw * w + 2 * c)
    # dgrad qa·c + qw·w + 2a; wgrad qa·(a + c) and dW accumulated in 2 bytes, read and written
    assert ks[K.FC2].bwd_bytes == pytest.approx(qa * c + qw * w + 2 * a + qa * (a + c) + 4 * w)


@pytest.mark.parametrize(("recipe", "per_element"), [
    ("delayed", 2 + 2), ("tensorwise", 2 + 2 + 2), ("rowwise", 0),
    ("blockwise", 2 + 2 * BLOCK_W), ("mxfp8", 2 + 2 * MX)])
def test_the_steps_weight_cast(recipe, per_element):
    """Read 2 bytes (current scaling: twice, amax first), write both FP8 copies; torchao's
    rowwise casts at every use instead: no op after the optimizer."""
    layout = Layout(tp=2, pp=2, dp=2, global_batch=4)
    ops = build(model(recipe), layout).ops[0]
    casts = [op for op in ops if op.purpose == KernelRun(K.FP8_WEIGHT_CAST)]
    weights = 2 * (64 * (64 + 2 * 32) + 64 * 64 + 64 * 192 + 96 * 64) / 2  # layers 0 and 1
    assert weight_cast_bytes(model(recipe), range(2), 2) == pytest.approx(per_element * weights)
    assert [op.mem_bytes for op in casts] == ([pytest.approx(per_element * weights)]
                                             if per_element else [])


def amaxes(recipe: str, **layout):
    plan = build(model(recipe), Layout(**layout))
    return [op for op in plan.ops[0] if isinstance(op.purpose, AmaxReduction)]


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise", "mxfp8"])
def test_scales_from_their_own_values_reduce_no_amax(recipe):
    assert amaxes(recipe, tp=2, pp=2, dp=2, sp=True, global_batch=4) == []


def test_current_scaling_reduces_each_gathered_casts_amax_over_tp():
    """With SP: qkv's and fc1's input forward (and in the recomputed forward), proj's and
    fc2's output gradient backward; 4 bytes each over the TP group, right after the amax."""
    layout = dict(tp=2, pp=2, dp=2, sp=True, global_batch=4, recompute="full")
    ops = build(model("tensorwise"), Layout(**layout)).ops[0]
    found = [op for op in ops if isinstance(op.purpose, AmaxReduction)]
    micro, layers = Layout(**layout).num_microbatches, 2
    assert len(found) == micro * layers * (2 + 2 + 2)  # forward, recomputed, backward
    assert {(op.group, op.size_bytes, op.dtype) for op in found} == {((0, 1), 4, "fp32")}
    for op in found:
        assert ops[op.deps[0]].purpose == KernelRun(K.FP8_AMAX)
        assert ops[ops.index(op) + 1].purpose == KernelRun(
            K.FP8_CAST if op.phase.value != "bwd" else K.FP8_CAST_GRAD)
    # without SP nothing is gathered, and every rank's amax is its own
    assert amaxes("tensorwise", tp=2, pp=2, dp=2, global_batch=4) == []


def test_delayed_scaling_reduces_three_and_two_amaxes_per_fp8_gemm_per_pass():
    found = amaxes("delayed", tp=2, pp=2, dp=2, global_batch=4)
    m = Layout(tp=2, pp=2, dp=2, global_batch=4).num_microbatches
    assert sorted(op.size_bytes for op in found) == [4 * 2 * 4 * 2] * m + [4 * 3 * 4 * 2] * m


def test_an_moe_layers_fp8_weights_are_its_experts_and_shared_experts():
    """The router stays bf16; E/ep routed experts split by etp, the shared ones by tp."""
    moe = dataclasses.replace(LLAMA, experts=8, top_k=2, moe_ffn_hidden=32, shared_experts=1,
                              dense_layers=1)
    attn = (64 * (64 + 2 * 32) + 64 * 64) / 2
    expert = 64 * 64 + 32 * 64  # SwiGLU fc1 h·2f_e, fc2 f_e·h
    assert fp8_weights_per_layer(moe, 0, 2, 4, 1) == attn + (64 * 192 + 96 * 64) / 2
    assert fp8_weights_per_layer(moe, 1, 2, 4, 1) == attn + 8 / 4 * expert + expert / 2


@pytest.mark.parametrize(("dtype", "recipe"), [("fp8", "mxfp8"), ("fp4", "")])
def test_block_scaled_casts_of_a_gathered_input_run_over_the_shard(dtype, recipe):
    """MXFP8 and NVFP4 quantize both copies of qkv's and fc1's input from the rank's
    sequence shard before SP gathers it: each of those casts (bytes, Hadamard FLOPs) is 1/T of
    the same cast without SP, where X is whole on every rank; dY's casts are the same."""
    m = dataclasses.replace(LLAMA, dtype=dtype, fp8_recipe=recipe)
    with_sp, without = layer_kernels(m, B, T, True), layer_kernels(m, B, T, False)
    fields = ("mem_bytes", "flops", "draws")
    for gemm in FUSED:
        (sp_before, _), (tp_before, _) = around(with_sp, gemm), around(without, gemm)
        assert len(sp_before) == len(tp_before) == (3 if dtype == "fp4" else 1)
        at = [k.name for k in with_sp].index(gemm)
        for a, b in zip(with_sp[at - len(sp_before):at], without[at - len(tp_before):at]):
            assert [getattr(a, f) * T for f in fields] == [getattr(b, f) for f in fields]
            assert (a.bwd_bytes, a.bwd_flops) == (b.bwd_bytes, b.bwd_flops) == (0, 0)
    for gemm in SHAPES:  # the output gradients' casts stay over the gathered dY
        assert around(with_sp, gemm)[1] == around(without, gemm)[1]


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_per_tensor_casts_of_a_gathered_input_split_into_shard_and_transpose(recipe):
    """Per-tensor scales gather only the row-wise copy: the shard's cast writes it (the norm
    itself, delayed), and backward transposes the gathered copy. Against the same layer
    without SP (one cast-transpose over the whole X): the transpose is its 2a, the
    shard's cast and amax 1/T of its read and of its row-wise write."""
    m = model(recipe)
    with_sp, without = layer_kernels(m, B, T, True), layer_kernels(m, B, T, False)
    for gemm in FUSED:
        a = SHAPES[gemm][0]
        (sp_before, sp_after), (tp_before, _) = around(with_sp, gemm), around(without, gemm)
        assert sp_after[0] == (CAST, 0, 2 * a)  # the transpose, first after the GEMM
        assert sum(f for _, f, _ in sp_before) == pytest.approx(
            sum(f for _, f, _ in tp_before) / T - a / T if recipe == "tensorwise" else 0)
