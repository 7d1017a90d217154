"""Sequence parallelism as each stack runs it (`traces.stack.regathers`): Megatron-Core / TE
(`kernels = "fused"`) keep the column-parallel GEMMs' input shards and all-gather them again in
backward; torch's DTensor (`"eager"`, `"compiled"`, torchtitan) keeps the gathered inputs and
gathers nothing again. Exact op counts, bytes and stored activations."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from sim.models.moe_memory import moe_activation_delta
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase
from traces.plan import build
from traces.purpose import GemmChunk, Kernel, KernelRun, TpChunk, TpSite
from traces.stored_activations import activation_bytes_per_layer

K = Kernel
LLAMA = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, seq_len=32, vocab=128,
                  ffn="swiglu", ffn_hidden=96, norm="rmsnorm", position="rope", bias=False,
                  tied_embeddings=False)
MLA = ModelSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, kv_lora_rank=16,
                q_lora_rank=24, head_dim=16, qk_rope_head_dim=8, v_head_dim=16, ffn="swiglu",
                ffn_hidden=96, norm="rmsnorm", position="rope", bias=False,
                tied_embeddings=False, attention="flash")
SP = Layout(tp=2, sp=True, global_batch=4, micro_batch=2)


def _backward_gathers(model: ModelSpec, layout: Layout) -> Counter:
    """(kernel, gathers the kept input again, bytes) of rank 0's backward TP all-gathers."""
    out: Counter = Counter()
    for op in build(model, layout).ops[0]:
        if op.kind is OpKind.ALL_GATHER and op.phase is Phase.BWD and \
                isinstance(op.purpose, TpSite | TpChunk):
            out[(op.purpose.kernel, op.purpose.saved, op.size_bytes)] += 1
    return out


@pytest.mark.parametrize("stack", ["eager", "compiled"])
def test_dtensor_backward_gathers_only_the_gradients(stack: str) -> None:
    fused = _backward_gathers(LLAMA, SP)
    torch_sp = _backward_gathers(dataclasses.replace(LLAMA, kernels=stack), SP)
    m, layers, sbh = 2, 2, 2 * 32 * 64 * 2  # micro-batches, layers, b·s·h bf16 bytes
    grads = {(K.PROJ, False, sbh): m * layers, (K.FC2, False, sbh): m * layers,
             (K.POS_EMBED, False, sbh): m}
    assert torch_sp == grads
    assert fused == {**grads, (K.QKV, True, sbh): m * layers, (K.FC1, True, sbh): m * layers,
                     (K.LOGITS, True, sbh): m}


def test_dtensor_keeps_the_reduce_scatters_and_forward_gathers() -> None:
    def others(model: ModelSpec) -> Counter:
        return Counter((op.kind, op.phase, op.size_bytes) for op in build(model, SP).ops[0]
                       if op.kind.is_collective and not (op.kind is OpKind.ALL_GATHER
                                                         and op.phase is Phase.BWD))
    assert others(dataclasses.replace(LLAMA, kernels="eager")) == others(LLAMA)


def test_dtensor_latent_attention_gathers_no_latents_again() -> None:
    for q_lora_rank in (24, 0):
        model = dataclasses.replace(MLA, q_lora_rank=q_lora_rank)
        fused = _backward_gathers(model, SP)
        eager = _backward_gathers(dataclasses.replace(model, kernels="eager"), SP)
        again = {key: n for key, n in fused.items() if key[1]}
        assert {k for k, _, _ in again} == {K.KV_UP, K.FC1, K.LOGITS} | \
            ({K.Q_UP} if q_lora_rank == 0 else set())
        assert eager == {key: n for key, n in fused.items() if not key[1]}


def test_asynctp_backward_of_qkv_and_fc1_is_the_reduce_scatter_alone() -> None:
    layout = dataclasses.replace(SP, tp_comm_overlap=True)
    ops = build(dataclasses.replace(LLAMA, kernels="compiled"), layout).ops[0]
    assert not any(isinstance(op.purpose, TpChunk) and op.purpose.saved for op in ops)
    assert not any(isinstance(op.purpose, GemmChunk) and op.phase is Phase.BWD
                   and op.purpose.kernel in (K.QKV, K.FC1) for op in ops)
    inline = Counter((op.purpose.kernel, op.kind) for op in ops
                     if isinstance(op.purpose, TpSite) and op.phase is Phase.BWD)
    assert inline == {(K.QKV, OpKind.REDUCE_SCATTER): 4, (K.FC1, OpKind.REDUCE_SCATTER): 4,
                      (K.LOGITS, OpKind.REDUCE_SCATTER): 2, (K.POS_EMBED, OpKind.ALL_GATHER): 2}


@pytest.mark.parametrize("tp", [2, 8])
def test_dtensor_stores_qkv_and_fc1_inputs_whole(tp: int) -> None:
    """Per layer, 2 bytes per s·b·h each for qkv's and fc1's inputs: 1/t of them with
    Megatron's shards, all of them with DTensor's gathered tensors."""
    layout = Layout(tp=tp, sp=True, global_batch=2, micro_batch=2)
    model = dataclasses.replace(LLAMA, hidden=512, heads=8, kv_heads=8, ffn_hidden=1024)
    sbh = 32 * 2 * 512
    fused = activation_bytes_per_layer(model, layout)
    eager = activation_bytes_per_layer(dataclasses.replace(model, kernels="eager"), layout)
    assert eager - fused == pytest.approx(4 * sbh * (1 - 1 / tp), rel=1e-12)
    full = dataclasses.replace(layout, recompute="full")
    assert activation_bytes_per_layer(dataclasses.replace(model, kernels="eager"), full) == \
        activation_bytes_per_layer(model, full)  # only the layer input, a shard either way


def test_dtensor_moe_layer_has_no_dense_fc1_input() -> None:
    moe = dataclasses.replace(LLAMA, experts=4, top_k=2, moe_ffn_hidden=48)
    layout = Layout(tp=2, sp=True, ep=2, global_batch=4, micro_batch=2)
    sbh = 32 * 2 * 64
    fused, eager = moe, dataclasses.replace(moe, kernels="eager")
    total = {m.kernels: activation_bytes_per_layer(m, layout) + moe_activation_delta(m, layout, 1)
             for m in (fused, eager)}
    assert total["eager"] - total["fused"] == pytest.approx(2 * sbh * (1 - 1 / 2), rel=1e-12)


def test_eager_with_tp_comm_overlap_leaves_qkv_and_fc1_backward_inline() -> None:
    """Without a kept shard to gather there is no bulk region (TE's bulk method overlaps that
    gather with dgrad): the reduce-scatter stays inline; the rest is TE's overlap as before."""
    layout = dataclasses.replace(SP, tp_comm_overlap=True)
    ops = build(dataclasses.replace(LLAMA, kernels="eager"), layout).ops[0]
    chunks = Counter((op.purpose.kernel, op.phase) for op in ops if isinstance(op.purpose, TpChunk))
    assert {k for k, _ in chunks} == {K.QKV, K.PROJ, K.FC1, K.FC2}
    assert (K.QKV, Phase.BWD) not in chunks and (K.FC1, Phase.BWD) not in chunks
    inline = Counter((op.purpose.kernel, op.kind) for op in ops
                     if isinstance(op.purpose, TpSite) and op.phase is Phase.BWD)
    assert inline[(K.QKV, OpKind.REDUCE_SCATTER)] == inline[(K.FC1, OpKind.REDUCE_SCATTER)] == 4


COPY = KernelRun(K.TP_SHARD_COPY)


def _copies(model: ModelSpec, layout: Layout) -> Counter:
    """(phase, bytes) of rank 0's DTensor shard copies."""
    return Counter((op.phase, op.mem_bytes) for op in build(model, layout).ops[0]
                   if op.purpose == COPY)


@pytest.mark.parametrize("stack", ["eager", "compiled"])
def test_dtensor_copies_each_inline_gather_and_scatter(stack: str) -> None:
    """funcol's chunk + cat for Shard(1): per micro-batch and layer 4 forward (after the
    gathers before qkv and fc1, before the scatters after proj and fc2) and 4 backward
    (gradients gathered before proj and fc2, scattered after qkv and fc1), plus the
    embedding's and the output layer's; each reads and writes the b·s·h buffer."""
    sbh = 2 * 32 * 64 * 2  # b·s·h bf16 bytes
    m, layers = 2, 2
    per_phase = m * (4 * layers + 2)
    # the scatters after qkv and fc1 first sum wq/wk/wv's (w1/w3's) input gradients
    # (traces.stack.input_grad_sum): compiled reads the p - 1 others in the copy, eager's
    # p - 1 adds move 3 buffers each
    qkv, fc1 = (4 * sbh, 3 * sbh) if stack == "compiled" else (8 * sbh, 5 * sbh)
    assert _copies(dataclasses.replace(LLAMA, kernels=stack), SP) == \
        {(Phase.FWD, 2 * sbh): per_phase, (Phase.BWD, 2 * sbh): per_phase - 2 * m * layers,
         (Phase.BWD, qkv): m * layers, (Phase.BWD, fc1): m * layers}
    assert not _copies(LLAMA, SP)  # Megatron-Core / TE: [s, b, h], no copy
    assert not _copies(dataclasses.replace(LLAMA, kernels=stack),
                       dataclasses.replace(SP, sp=False))  # all-reduces: no dim


def test_dtensor_copy_follows_the_gather_and_precedes_the_scatter() -> None:
    ops = build(dataclasses.replace(LLAMA, kernels="eager"), SP).ops[0]
    for i, op in enumerate(ops):
        if op.purpose != COPY:
            continue
        before, after = ops[i - 1], ops[i + 1]
        summed = {K.QKV: 2 * 3, K.FC1: 1 * 3}.get(before.purpose.kernel, 0) \
            if before.phase is Phase.BWD and isinstance(before.purpose, KernelRun) else 0
        assert (before.kind is OpKind.ALL_GATHER and 2 * before.size_bytes == op.mem_bytes) or \
            (after.kind is OpKind.REDUCE_SCATTER
             and (2 + summed) * after.size_bytes == op.mem_bytes)


def test_dtensor_copies_fp8_gathers_in_fp8() -> None:
    """Tensorwise FP8 gathers the qkv and fc1 inputs (and proj's, fc2's gradients) in FP8:
    their copies move 2·b·s·h bytes; the scatters, the output layer's gather and the
    embedding's gradient stay bf16 (4·b·s·h)."""
    model = dataclasses.replace(LLAMA, kernels="compiled", dtype="fp8", fp8_recipe="tensorwise")
    bsh, m, layers = 2 * 32 * 64, 2, 2
    assert _copies(model, SP) == {(Phase.FWD, 2 * bsh): m * 2 * layers,
                                  (Phase.FWD, 4 * bsh): m * (2 * layers + 2),
                                  (Phase.BWD, 2 * bsh): m * 2 * layers,
                                  (Phase.BWD, 4 * bsh): m * 2,
                                  (Phase.BWD, 8 * bsh): m * layers,  # qkv's: 3 sums + 1
                                  (Phase.BWD, 6 * bsh): m * layers}  # fc1's: 2 + 1


def test_asynctp_fuses_the_copies_of_its_regions() -> None:
    """micro_pipeline_tp matches the split + cat with the collective: only the inline
    collectives (qkv's and fc1's backward scatter, the embedding's, the output layer's)
    keep a copy."""
    layout = dataclasses.replace(SP, tp_comm_overlap=True)
    sbh, m, layers = 2 * 32 * 64 * 2, 2, 2
    assert _copies(dataclasses.replace(LLAMA, kernels="compiled"), layout) == \
        {(Phase.FWD, 2 * sbh): m * 2, (Phase.BWD, 2 * sbh): m * 2,
         (Phase.BWD, 4 * sbh): m * layers, (Phase.BWD, 3 * sbh): m * layers}


def test_dtensor_recomputed_forward_copies_as_the_forward() -> None:
    """Full recomputation re-runs the forward's gathers and scatters, each with its copy."""
    layout = dataclasses.replace(SP, recompute="full")
    copies = _copies(dataclasses.replace(LLAMA, kernels="compiled"), layout)
    sbh, m, layers = 2 * 32 * 64 * 2, 2, 2
    assert copies[(Phase.RECOMPUTE, 2 * sbh)] == m * 4 * layers  # the blocks, not the head
    assert copies[(Phase.FWD, 2 * sbh)] == m * (4 * layers + 2)
