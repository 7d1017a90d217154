"""torchtitan's separate wq/wk/wv and w1/w3 GEMMs (`traces.stack.gemm_splits`): the compute
model costs a split plan GEMM as its parts, each exactly the GEMM a linear of that width is
(`traces.fp8.fp8_linear`, `traces.kernel_work.gemm_kernel`), whole or as AsyncTP's chunks; the
parts' input gradients are summed where the stack sums them (`input_grad_sum`)."""

from __future__ import annotations

import dataclasses

import pytest

from sim.models.compute import ComputeModel
from sim.profile import default_profile
from topology.presets import H100_SXM
from traces import stack_eager
from traces.fp8 import fp8_linear
from traces.fp8 import recipe as fp8_recipe
from traces.kernel_work import KernelWork, gemm_kernel
from traces.kernels import layer_kernels
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Phase
from traces.plan import build
from traces.plan.overlap import chunk_bytes
from traces.purpose import GemmChunk, Kernel
from traces.stack import GemmSplit, gemm_splits, restack

K = Kernel
LLAMA = ModelSpec(layers=2, hidden=4096, heads=32, kv_heads=8, seq_len=2048, vocab=128256,
                  ffn="swiglu", ffn_hidden=14336, norm="rmsnorm", position="rope", bias=False,
                  dropout=0.0)
FP8 = dataclasses.replace(LLAMA, kernels="compiled", dtype="fp8", fp8_recipe="tensorwise")
PROFILE = default_profile(H100_SXM)


def test_the_splits_are_torchtitans_projections() -> None:
    assert gemm_splits(FP8) == {"qkv": GemmSplit((4096, 1024, 1024), 1, 2),
                                "fc1": GemmSplit((14336, 14336), 1, 2)}
    assert gemm_splits(dataclasses.replace(LLAMA, kernels="eager")) == \
        {"qkv": GemmSplit((4096, 1024, 1024), 2, 2), "fc1": GemmSplit((14336, 14336), 2, 2)}
    assert gemm_splits(LLAMA) == {}  # Megatron-Core fuses linear_qkv and linear_fc1
    assert "fc1" not in gemm_splits(dataclasses.replace(LLAMA, kernels="eager", ffn="gelu"))


def _gemm(works: list[KernelWork]) -> KernelWork:
    return next(w for w in works if w.gemm)


def _seconds(compute: ComputeModel, w: KernelWork, backward: bool) -> float:
    return compute.kernel_time(str(w.name), w.bwd_flops if backward else w.flops,
                               w.bwd_bytes if backward else w.mem_bytes, w.gemm,
                               backward=backward, fp8=w.fp8)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize(("kernel", "widths"), [(K.QKV, (512, 128, 128)), (K.FC1, (1792, 1792))])
def test_a_split_gemm_costs_its_parts_as_linears_of_their_width(kernel, widths, backward):
    """At TP 8: wq 512, wk and wv 128 wide (fc1: w1, w3 1792 each), each an FP8 linear of its
    own: its FLOPs, its input read, its weight, its output, its input gradient written."""
    m, h, t = 2 * 2048, 4096, 8
    split = ComputeModel(H100_SXM, PROFILE, splits=gemm_splits(FP8))
    whole = _gemm(fp8_linear(FP8, kernel, (1, m, sum(widths), h), 2, shard=t))
    parts = [_gemm(fp8_linear(FP8, kernel, (1, m, n, h), 2, shard=t)) for n in widths]
    plain = ComputeModel(H100_SXM, PROFILE)
    assert _seconds(split, whole, backward) == pytest.approx(
        sum(_seconds(plain, p, backward) for p in parts), rel=1e-12)
    assert _seconds(split, whole, backward) > _seconds(plain, whole, backward)


def test_a_bf16_split_gemm_costs_its_parts_as_gemms_of_their_width():
    eager = dataclasses.replace(LLAMA, kernels="eager")
    split = ComputeModel(H100_SXM, PROFILE, splits=gemm_splits(eager))
    plain = ComputeModel(H100_SXM, PROFILE)
    whole = gemm_kernel(K.QKV, (1, 2048, 6144, 4096), 2, 2)
    parts = [gemm_kernel(K.QKV, (1, 2048, n, 4096), 2, 2) for n in (4096, 1024, 1024)]
    for backward in (False, True):
        assert _seconds(split, whole, backward) == pytest.approx(
            sum(_seconds(plain, p, backward) for p in parts), rel=1e-12)


def test_asynctp_chunks_run_each_projection_on_each_chunk():
    """fused_all_gather_matmul(A_shard, [wq, wk, wv]): each gathered chunk of the tokens feeds
    one mm per weight, so a qkv chunk costs its three parts at the chunk's rows, each with
    the chunk's share of that part's linear and the rest of its weight, which each mm reads
    whole (`traces.plan.overlap.chunk_bytes`)."""
    layout = Layout(tp=2, sp=True, tp_comm_overlap=True, global_batch=2, micro_batch=1)
    ops = build(FP8, layout).ops[0]
    chunk = next(op for op in ops if isinstance(op.purpose, GemmChunk)
                 and op.purpose.kernel is K.QKV and op.phase is Phase.FWD)
    _, m, n, h = chunk.gemm
    assert (m, n) == (1024, 3072)  # 2048 tokens over 2 ranks; (4096 + 2 * 1024) / 2
    share = m / 2048
    split = ComputeModel(H100_SXM, PROFILE, splits=gemm_splits(FP8))
    plain = ComputeModel(H100_SXM, PROFILE)
    parts = [_gemm(fp8_linear(FP8, K.QKV, (1, 2048, w, h), 2, shard=2))
             for w in (2048, 512, 512)]
    q_weight = fp8_recipe(FP8).q_weight
    assert split.duration(chunk) == pytest.approx(sum(
        plain.kernel_time("qkv", p.flops * share,
                          chunk_bytes(p.mem_bytes * share, share, h * p.gemm[2] * q_weight),
                          (1, m, p.gemm[2], h), fp8=True) for p in parts), rel=1e-12)
    assert split.duration(chunk) > plain.duration(chunk)


def test_without_sp_the_norms_backward_sums_the_input_gradients():
    """At TP 1 the sum of wq/wk/wv's (w1/w3's) input gradients feeds ln1's (ln2's) backward:
    compiled fuses the adds into the norm's kernel (p - 1 more reads of n·e: 4n·e + 2n·e,
    4n·e + n·e), eager runs autograd's p - 1 adds (3·n·e each) before RMSNorm's backward."""
    b, s, h, e = 2, 2048, 4096, 2
    n = b * s * h
    compiled = dataclasses.replace(LLAMA, kernels="compiled")
    works = {w.name: w for w in restack(compiled, layer_kernels(compiled, b, 1, False), b, 1,
                                        False)}
    assert works[K.LN1].bwd_bytes == (4 + 2) * n * e and works[K.LN1].launches[1] == 1
    assert works[K.LN2].bwd_bytes == (4 + 1) * n * e and works[K.LN2].launches[1] == 1
    eager = dataclasses.replace(LLAMA, kernels="eager")
    works = {w.name: w for w in restack(eager, layer_kernels(eager, b, 1, False), b, 1, False)}
    _, norm = stack_eager.rmsnorm(n, b * s, e, True)
    assert works[K.LN1].bwd_bytes == sum(x for _, x in norm) + 2 * 3 * n * e
    assert works[K.LN2].bwd_bytes == sum(x for _, x in norm) + 1 * 3 * n * e
    assert works[K.LN1].launches[1] == len(norm) + 2
    assert works[K.LN2].launches[1] == len(norm) + 1
