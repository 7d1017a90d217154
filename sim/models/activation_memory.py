"""Stored activations of one GPU: per layer (Korthikanti et al. 2022, as `activation_terms`
generalizes it), per forward pass of a chunk, and how many passes a schedule keeps in flight.

Split from `sim.models.memory`, which adds them to the model states and working buffers.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.models.moe_memory import moe_activation_delta, rank_layers
from sim.models.saved_activations import saving_terms
from traces import cpu_offload, op_sac
from traces.errors import ConfigError
from traces.layout import Layout, Recompute
from traces.model import ModelSpec
from traces.pipeline import Action
from traces.recompute import recomputes_core
from traces.zero_bubble import frees_at

GELU_MLP_TERM = 16
"""A GeLU MLP's stored activations per s·b·h: 2·4 (GeLU input) + 2·4 (fc2 input), the paper's
f = 4h. Kept literal for any `ffn_hidden` (shipped predictions unchanged); 4f/h is the count
for another width (Llama-2-7B-shaped f = 11008, h = 4096: 10.75 instead of 16)."""


def activation_terms(model: ModelSpec) -> tuple[float, float]:
    """(replicated, split) stored activations of one layer per s·b·h, in bytes: what TP leaves
    whole (norm inputs, the qkv and fc1 inputs, the two dropout masks) and what it splits.

    Korthikanti et al. 2022 (Table 2), term by term with 2-byte values and 1-byte masks, for
    g key/value heads:
        replicated  ln1 and ln2 inputs 2 + 2, qkv input 2, fc1 input 2, masks 1 + 1   = 10
        split       Q 2, K and V 2g/a each, proj input 2                             = 4 + 4g/a
                    GeLU input 8 and fc2 input 8 (the paper's f = 4h, kept as it is
                    for every GeLU width: GELU_MLP_TERM)                             = 16
                    SwiGLU of width f: gate and up 4f/h, fc2 input 2f/h              = 6f/h
    GPT (g = a): 10 + 24 = 34. A head width d of its own scales Q, K, V and the proj input
    by ad/h: (4 + 4g/a)·ad/h; qk_norm (`traces.heads`) keeps its inputs, the q and k heads
    before the norm, 2 bytes each: + 2(1 + g/a)·ad/h, split (its output passes through RoPE,
    which keeps nothing, to the core, which keeps Q and K, already counted).
    With dropout = 0 (`ModelSpec.dropout`) the two masks go:
    8 + 24 = 32. Rotary embedding keeps nothing (its backward is the inverse
    rotation of a fixed table); RMSNorm keeps its input as LayerNorm does; FP8 models are
    counted at these bf16 sizes here, and `saved_activations.saving_terms` takes off (or
    adds) what FP8 changes (Transformer Engine's rule: `sim.models.te_fp8_memory`). A
    context-parallel rank holds 1/cp of the sequence: both terms divide by cp."""
    mlp = 6 * model.ffn_hidden / model.hidden if model.ffn == "swiglu" else GELU_MLP_TERM
    replicated = 10 if model.dropout else 8
    if model.mla:  # Q, K of a(d + r) and V, O of a·d_v, 2 bytes each: all full size
        a, d, r, dv = model.heads, model.head_dim, model.qk_rope_head_dim, model.v_head_dim
        return replicated, 4 * a * (d + r + dv) / model.hidden + mlp
    g_a = model.kv_heads / model.heads
    q_h = model.q_width / model.hidden  # ad/h: 1.0 unless head_dim is set apart
    qk_norm = 2 * (1 + g_a) * q_h if model.qk_norm else 0.0
    return replicated, (4 + 4 * g_a) * q_h + qk_norm + mlp


def latent_term(model: ModelSpec) -> float:
    """Latent attention's stored latents per s·b·h, in bytes, which TP does not split (the
    down-projection runs in full on every TP rank; SP keeps sequence shards of them, and the
    up-projections, like qkv, keep their gathered input's shard): c_q and c_kv as the norms'
    inputs and again, normalized, as the up-projections' inputs, 2 bytes each: 4(q_r + k_r)/h.
    Without query compression q_up reads ln1's output, already counted. 0 without MLA."""
    return 4 * (model.q_lora_rank + model.kv_lora_rank) / model.hidden if model.mla else 0.0


def activation_bytes_per_layer(model: ModelSpec, layout: Layout) -> float:
    """Stored activations of one transformer layer for one micro-batch on one GPU.

    Korthikanti et al. 2022, Table 2, with 2-byte activations and 1-byte dropout masks, as
    `activation_terms` generalizes it to GQA, SwiGLU and latent attention (`latent_term`)."""
    s, b, h, a, t = model.seq_len, layout.micro_batch, model.hidden, model.heads, layout.tp
    s //= layout.cp  # CP: a rank holds 2 of the 2·cp chunks of the sequence (only flash, no s²)
    sbh = s * b * h
    if layout.recompute == Recompute.FULL:
        # Only the layer input, b*s*h in 2 bytes; SP keeps 1/t of the sequence of it.
        return 2 * sbh / (t if layout.sp else 1)
    if layout.recompute == Recompute.SELECTIVE_OP:
        return op_sac.saved_bytes(model, layout)  # torchtitan's per-op rule
    # 34sbh = 24sbh of TP-split matmul inputs, GeLU, Q, K, V... + 10sbh of norms and dropout,
    # which only SP splits: 34/t with SP, 10 + 24/t without (= 34 when t = 1).
    replicated, split = activation_terms(model)
    cut = saving_terms(model, layout)  # recompute_modules, the FP8 cache
    replicated, split = replicated - cut[0], split - cut[1]
    pointwise = (replicated + split) / t if layout.sp else replicated + split / t
    if model.mla:  # SP: the down-projection's outputs are sequence shards too
        pointwise += (latent_term(model) - cut[2]) / (t if layout.sp else 1)
    # 5as^2b = scores 2as^2b + softmax-dropout mask as^2b + dropped-out probabilities 2as^2b,
    # split over t heads-wise; flash attention and selective recomputation never store them.
    # With dropout = 0 only the softmax's output, 2as^2b, which av reads as it is.
    keeps_scores = model.attention == "unfused" and (layout.recompute == Recompute.NONE or
                                                     layout.recompute == Recompute.SELECTIVE
                                                     and not recomputes_core(layout))
    scores = (5 if model.dropout else 2) * a * s / (h * t) if keeps_scores else 0.0
    return sbh * (pointwise + scores)


def peak_in_flight(actions: list[Action]) -> int:
    """Max number of (stage, micro-batch) whose forward is done and backward not yet, along the
    list: how many micro-batches' activations a rank holds at once (with a split backward,
    until its W: `traces.zero_bubble.frees_at`)."""
    in_flight: set[tuple[int, int]] = set()
    peak = 0
    frees = frees_at(actions)
    for action in actions:
        key = (action.stage, action.microbatch)
        if action.kind == "F":
            in_flight.add(key)
            peak = max(peak, len(in_flight))
        elif action.kind != frees:
            continue
        elif key in in_flight:
            in_flight.remove(key)
        else:
            raise ConfigError(f"schedule: {action} runs before the forward {key[0]}F{key[1]}")
    return peak



def chunk_bytes(model: ModelSpec, layout: Layout, pp_rank: int) -> dict[int, float] | None:
    """Stored activations of one forward pass of each of the rank's chunks, where their layer
    counts differ (account_for_embedding / account_for_loss with vp > 1, a pipeline_layout);
    None where they are equal (`per_pass` then stands for every chunk)."""
    stages = layout.stages_of_rank(pp_rank)
    layers = {s: layout.layers_of_stage(model, s) for s in stages}
    if len({len(r) for r in layers.values()}) == 1:
        return None
    per_layer = activation_bytes_per_layer(model, layout)
    if not model.experts:
        return {s: len(r) * per_layer for s, r in layers.items()}
    return {s: sum(per_layer + moe_activation_delta(model, layout, i) for i in r)
            for s, r in layers.items()}


def held_after(actions: Sequence[Action], chunks: dict[int, float]) -> list[float]:
    """Stored activations held after each action: the forwards done whose backward is not,
    each its chunk's bytes."""
    in_flight: set[tuple[int, int]] = set()
    held, out = 0.0, []
    frees = frees_at(actions)
    for action in actions:
        key = (action.stage, action.microbatch)
        if action.kind == "F":
            in_flight.add(key)
            held += chunks[action.stage]
        elif action.kind != frees:
            pass
        elif key in in_flight:
            in_flight.remove(key)
            held -= chunks[action.stage]
        else:
            raise ConfigError(f"schedule: {action} runs before the forward {key[0]}F{key[1]}")
        out.append(held)
    return out


def per_pass(model: ModelSpec, layout: Layout, pp_rank: int) -> float:
    """Stored activations of one forward pass of a chunk of `pp_rank`: its layers' (an MoE
    model's, averaged over the rank's chunks)."""
    per_layer = activation_bytes_per_layer(model, layout)
    if not model.experts:
        offloaded = cpu_offload.freed_layers(layout)  # activations held in host memory
        return (layout.layers_per_chunk(model, pp_rank) - offloaded) * per_layer
    layers = rank_layers(model, layout, pp_rank)
    return sum(per_layer + moe_activation_delta(model, layout, layer)
               for layer in layers) / len(layout.stages_of_rank(pp_rank))  # vp; dualpipe 2
