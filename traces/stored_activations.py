"""Stored activations of one transformer layer for one micro-batch on one GPU (Korthikanti et
al. 2022, as `activation_terms` generalizes it): what the memory model holds per layer
(`sim.models.activation_memory`) and what CPU offloading copies to the host and back
(`traces.plan.offload`). Pure arithmetic on a `ModelSpec` and a `Layout`.
"""

from __future__ import annotations

from traces import op_sac
from traces.layout import Layout, Recompute
from traces.model import ModelSpec
from traces.recompute import recomputes_core
from traces.saved_activations import dense_mlp_term, saving_terms
from traces.stack import regathers

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
    adds) what FP8 changes (Transformer Engine's rule: `traces.te_fp8_memory`). A
    context-parallel rank holds 1/cp of the sequence: both terms divide by cp."""
    mlp = dense_mlp_term(model)
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


def gathered_inputs(model: ModelSpec, layout: Layout) -> tuple[float, float]:
    """(attention, dense MLP) bytes per s·b·h of the column-parallel GEMMs' inputs that SP
    gathers from sequence shards: qkv's (latent attention: the up-projections', the normalized
    latents, and q_up's ln1 output without query compression) and fc1's, as stored after what
    the options spare (`saving_terms`: "layernorm"'s and the FP8 cache's halves of the
    replicated cut are these two inputs). Megatron/TE keep 1/t shards of them, torch's DTensor
    the whole gathered tensors (`traces.stack.regathers`)."""
    cut = saving_terms(model, layout)
    dense = 2 - cut[0] / 2
    if not model.mla:
        return dense, dense
    latents = 2 * (model.q_lora_rank + model.kv_lora_rank) / model.hidden - cut[2]
    return latents + (dense if model.q_lora_rank == 0 else 0.0), dense


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
    if layout.sp and not regathers(model):  # DTensor keeps the gathered inputs whole
        pointwise += sum(gathered_inputs(model, layout)) * (1 - 1 / t)
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
