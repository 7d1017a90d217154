"""FP8 and FP4 sequence-parallel all-gathers (issue 32): where the stack casts before it
gathers (Transformer Engine's delayed and current scaling, torchao's tensorwise; TE's MXFP8 and
NVFP4 with their scales), the gathers feeding qkv's and fc1's input and proj's and fc2's output
gradient carry the quantized bytes (1 an element; MXFP8 1 + 1/32; NVFP4 1/2 + 1/16); rowwise
(torchtitan gathers in bf16), blockwise and every reduce-scatter keep 2 bytes."""

from __future__ import annotations

import dataclasses

import pytest

from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import OpKind
from traces.plan import build
from traces.purpose import Kernel, TpChunk, TpSite

K = Kernel
LLAMA = ModelSpec(layers=4, hidden=64, heads=4, kv_heads=2, seq_len=32, vocab=128,
                  ffn="swiglu", ffn_hidden=96, norm="rmsnorm", position="rope", bias=False,
                  dtype="fp8")
BF16_BUFFER = 1 * 32 * 64 * 2  # b·s·h in bf16, one micro-batch of one sample
FP8_INPUTS = {(K.QKV, False), (K.FC1, False), (K.PROJ, True), (K.FC2, True)}


def tp_ops(recipe: str, overlap: bool):
    model = dataclasses.replace(LLAMA, fp8_recipe=recipe)
    layout = Layout(tp=2, pp=2, dp=2, sp=True, global_batch=4, recompute="full",
                    tp_comm_overlap=overlap)
    return [op for op in build(model, layout).ops[0] if isinstance(op.purpose, (TpSite, TpChunk))]


def in_fp8(op) -> bool:
    site = op.purpose
    return op.kind is OpKind.ALL_GATHER and (site.kernel, site.grad) in FP8_INPUTS


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_gathers_into_an_fp8_gemm_carry_one_byte_an_element(recipe):
    ops = tp_ops(recipe, overlap=False)
    gathered = [op for op in ops if in_fp8(op)]
    # qkv's and fc1's input forward, recomputed and (the kept shard) backward, proj's and
    # fc2's output gradient backward: 8 per layer, 2 layers a stage
    assert len(gathered) == Layout(tp=2, pp=2, dp=2, global_batch=4).num_microbatches * 2 * 8
    assert {op.name for op in ops} == {"tp"}
    assert {op.size_bytes for op in gathered} == {BF16_BUFFER / 2}
    assert {op.size_bytes for op in ops if op.kind is OpKind.REDUCE_SCATTER} == {BF16_BUFFER}


@pytest.mark.parametrize("overlap", [False, True])
def test_delayed_halves_exactly_the_fp8_gathers_of_rowwise(overlap):
    """Same collectives in the same order, with and without tp_comm_overlap's chunks."""
    fp8, rowwise = tp_ops("delayed", overlap), tp_ops("rowwise", overlap)
    assert [(op.kind, op.purpose) for op in fp8] == [(op.kind, op.purpose) for op in rowwise]
    assert sum(map(in_fp8, fp8)) == 32
    for a, b in zip(fp8, rowwise):
        assert a.size_bytes == (b.size_bytes / 2 if in_fp8(a) else b.size_bytes)


@pytest.mark.parametrize("overlap", [False, True])
def test_mxfp8_gathers_carry_one_byte_and_an_e8m0_scale_per_32(overlap):
    """TE quantizes to MXFP8 before it gathers and moves the data with its scales:
    b·s·h·(1 + 1/32) bytes on exactly the gathers delayed scaling sends in FP8 (issue 32)."""
    mx, delayed = tp_ops("mxfp8", overlap), tp_ops("delayed", overlap)
    assert [(op.kind, op.purpose) for op in mx] == [(op.kind, op.purpose) for op in delayed]
    if not overlap:  # whole buffers (the overlap's chunks are shares of them)
        assert {op.size_bytes for op in mx if in_fp8(op)} == {32 * 64 * 33 / 32}
    for a, b in zip(mx, delayed):
        assert a.size_bytes == (b.size_bytes * 33 / 32 if in_fp8(a) else b.size_bytes)


def test_blockwise_still_gathers_in_bf16():
    assert {op.size_bytes for op in tp_ops("blockwise", False) if op.kind is OpKind.ALL_GATHER} \
        == {BF16_BUFFER}


@pytest.mark.parametrize("overlap", [False, True])
def test_nvfp4_gathers_carry_a_nibble_and_an_e4m3_scale_per_16(overlap):
    """TE quantizes to NVFP4 before it gathers and moves the packed data with its scales
    (`_all_gather_nvfp4`): b·s·h·(1/2 + 1/16) bytes on exactly the gathers delayed scaling
    sends in FP8, 9/16 of their bytes; the reduce-scatters stay bf16."""
    model = dataclasses.replace(LLAMA, dtype="fp4", fp8_recipe="")
    layout = Layout(tp=2, pp=2, dp=2, sp=True, global_batch=4, recompute="full",
                    tp_comm_overlap=overlap)
    fp4 = [op for op in build(model, layout).ops[0] if isinstance(op.purpose, (TpSite, TpChunk))]
    delayed = tp_ops("delayed", overlap)
    assert [(op.kind, op.purpose) for op in fp4] == [(op.kind, op.purpose) for op in delayed]
    if not overlap:
        assert {op.size_bytes for op in fp4 if in_fp8(op)} == {32 * 64 * 9 / 16}
    for a, b in zip(fp4, delayed):
        assert a.size_bytes == (b.size_bytes * 9 / 16 if in_fp8(a) else b.size_bytes)


def test_bf16_gathers_are_unchanged():
    """A bf16 model's SP all-gathers and reduce-scatters all carry b·s·h·2 bytes."""
    model = dataclasses.replace(LLAMA, dtype="bf16", fp8_recipe="")
    layout = Layout(tp=2, pp=2, dp=2, sp=True, global_batch=4, recompute="full")
    ops = [op for op in build(model, layout).ops[0] if isinstance(op.purpose, TpSite)
           and op.kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER)]
    assert ops and {op.size_bytes for op in ops} == {BF16_BUFFER}
