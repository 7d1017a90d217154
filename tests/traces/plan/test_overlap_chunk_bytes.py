"""tp_comm_overlap's GEMM chunks each read one operand whole (`traces.plan.overlap.chunk_bytes`):
the weight in a ring exchange (TE's split_overlap_ag / split_overlap_rs P2P), the input in TE's
pipeline reduce-scatter (its chunks slice the weight's rows). Over a region's chunks: the bytes
of the product they replace plus (chunks - 1) more reads of that operand."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

import pytest

from traces.fp8 import recipe as fp8_recipe
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Op, Phase
from traces.plan import build
from traces.plan.overlap import chunk_bytes
from traces.purpose import GemmChunk, GemmPart, Kernel, KernelRun

K = Kernel
LLAMA = ModelSpec(layers=2, hidden=1024, heads=8, kv_heads=2, seq_len=1024, vocab=4096,
                  ffn="swiglu", ffn_hidden=2816, norm="rmsnorm", position="rope", bias=False,
                  dropout=0.0)
FP8 = dataclasses.replace(LLAMA, dtype="fp8", fp8_recipe="tensorwise")
MXFP8 = dataclasses.replace(LLAMA, dtype="fp8", fp8_recipe="mxfp8")
TP = 4


def _ops(model: ModelSpec, overlap: bool) -> Sequence[Op]:
    layout = Layout(tp=TP, sp=True, tp_comm_overlap=overlap, global_batch=1, micro_batch=1)
    return build(model, layout).ops[0]


def _gemms(ops: Sequence[Op]) -> dict[tuple[Kernel, Phase | None, int | None], Op]:
    """The plan's whole GEMM ops by kernel, phase and layer (micro-batch 0)."""
    return {(op.purpose.kernel, op.phase, op.layer): op for op in ops
            if isinstance(op.purpose, KernelRun) and op.gemm and op.microbatch == 0
            and op.purpose.kernel in (K.QKV, K.PROJ, K.FC1, K.FC2)}


def _elements(model: ModelSpec) -> tuple[float, float]:
    """Bytes of an input and a weight element as the GEMMs read them."""
    rec = fp8_recipe(model)
    return (rec.q_act, rec.q_weight) if model.fp8 else (model.dtype_bytes, model.dtype_bytes)


@pytest.mark.parametrize("model", [LLAMA, FP8, MXFP8], ids=["bf16", "fp8", "mxfp8"])
def test_chunks_sum_to_the_product_and_t_minus_1_more_weight_reads(model: ModelSpec) -> None:
    whole = _gemms(_ops(model, overlap=False))
    chunks: dict[tuple[Kernel, Phase | None, int | None, GemmPart], list[Op]] = defaultdict(list)
    for op in _ops(model, overlap=True):
        if isinstance(op.purpose, GemmChunk) and op.microbatch == 0:
            chunks[(op.purpose.kernel, op.phase, op.layer, op.purpose.part)].append(op)
    checked = set()
    for (kernel, phase, layer, part), ops in chunks.items():
        op = whole[(kernel, phase, layer)]
        _, m, n, k = op.gemm
        act, wt = _elements(model)
        gathered = kernel in (K.QKV, K.FC1)  # its input all-gathered (else reduce-scattered)
        pipeline = part is GemmPart.FPROP and not gathered
        reread = m * k * act if pipeline else n * k * wt
        product = op.mem_bytes if part is GemmPart.FPROP else op.mem_bytes / 2
        assert sum(c.mem_bytes for c in ops) == pytest.approx(
            product + (len(ops) - 1) * reread, rel=1e-12)
        if part is GemmPart.FPROP:  # ring exchange: t chunks; pipeline: num_splits 4
            assert len(ops) == (TP if gathered else 4)
        else:  # proj, fc2 dgrad: ring exchange; qkv, fc1: bulk, whole; wgrad whole
            assert len(ops) == (TP if part is GemmPart.DGRAD and not gathered else 1)
        checked.add((kernel, part))
    assert {(K.QKV, GemmPart.FPROP), (K.FC1, GemmPart.FPROP), (K.PROJ, GemmPart.FPROP),
            (K.FC2, GemmPart.FPROP), (K.PROJ, GemmPart.DGRAD), (K.FC2, GemmPart.DGRAD),
            (K.FC1, GemmPart.WGRAD)} <= checked


def test_chunk_bytes_is_its_share_and_the_rest_of_the_weight() -> None:
    assert chunk_bytes(10.0, 0.25, 400.0) == 10.0 + 300.0
    assert chunk_bytes(10.0, 1.0, 400.0) == 10.0  # one chunk: the product as it was
