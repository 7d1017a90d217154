"""What `recompute_modules` and `fp8_activation_cache` (`traces.recompute`) take off a layer's
stored activations, in the terms of `traces.stored_activations.activation_terms` (bytes per s·b·h,
2-byte values):

    replicated  layernorm: the two norms' outputs, qkv's (mla_down's) and fc1's inputs, 2 + 2;
                else with the FP8 cache those inputs in 1 byte: 1 + 1
    latent      mla_up_proj: the normalized latents, the up-projections' inputs, 2(q_r+k_r)/h
                (the latents themselves, the norms' inputs, stay); else FP8: (q_r+k_r)/h
    split       mlp: the dense MLP's whole term and fc1's input (`mlp_saving`; an MoE layer's
                delta adds them back, `sim.models.moe_memory`)
                mla_up_proj: Q and K of a(d+r) and V of a·d_v, 2 bytes each; FP8: the output
                projection's input in E5M6, 1.5 bytes instead of 2 (0.5·a·d_v/h; 0.5·ad/h
                without MLA); FP8: the dense MLP's fc2 input in 1 byte (f/h SwiGLU, 4 GeLU)
    experts     (an MoE layer, `moe_mlp_terms`) FP8: every expert input (fc1's, the
                activation's, fc2's) in 1 byte; moe_act: fc2's input not stored

DeepSeek-V3 §3.3.2 keeps the attention output feeding the output projection in E5M6 (12
bits, "sensitive to precision") and caches the MoE SwiGLU's inputs in FP8; the other
activations it names (norm inputs, the residual stream, the router's scores) stay as they are.

Transformer Engine's FP8 (`dtype = "fp8"`, `kernels = "fused"`, without the cache key; `te_fp8`)
saves what its modules save, whatever the key says (`traces.te_fp8_memory`).
"""

from __future__ import annotations

from dataclasses import replace

from traces.layout import Layout
from traces.model import ModelSpec
from traces.te_fp8_memory import te_fp8, te_fp8_mlp, te_fp8_terms

GELU_FC2_TERM = 8
"""A GeLU MLP's fc2 input per s·b·h, half of memory's literal GELU_MLP_TERM (f = 4h)."""
E5M6_SAVING = 0.5
"""Bytes a 12-bit E5M6 value spares against a 2-byte bf16 one."""


def saving_terms(model: ModelSpec, layout: Layout) -> tuple[float, float, float]:
    """(replicated, split, latent) bytes per s·b·h the options spare (module docstring); zeros
    without them."""
    modules, fp8 = layout.recompute_modules, layout.fp8_activation_cache
    if te_fp8(model, layout):
        replicated, split, latent = te_fp8_terms(model, layout)
        if "mlp" in modules:  # the whole MLP in place of what TE's FP8 spares of it
            split += mlp_saving(model, layout) - te_fp8_mlp(model, layout)
        return replicated, split, latent
    if not fp8 and not {"layernorm", "mla_up_proj", "mlp"} & set(modules):
        return 0.0, 0.0, 0.0
    h = model.hidden
    replicated = 4.0 if "layernorm" in modules else 2.0 if fp8 else 0.0
    latents = (model.q_lora_rank + model.kv_lora_rank) / h if model.mla else 0.0
    latent = 2 * latents if "mla_up_proj" in modules else latents if fp8 else 0.0
    split = mlp_saving(model, layout)
    if model.mla:
        a, d, r, dv = model.heads, model.head_dim, model.qk_rope_head_dim, model.v_head_dim
        if "mla_up_proj" in modules:
            split += (4 * a * (d + r) + 2 * a * dv) / h
        split += E5M6_SAVING * a * dv / h if fp8 else 0.0
    elif fp8:
        split += E5M6_SAVING * model.q_width / h
    return replicated, split, latent


def mlp_saving(model: ModelSpec, layout: Layout) -> float:
    """The dense MLP's share of the split saving: fc2's input in FP8; with "mlp" (the dense
    MLP checkpointed whole, `traces.recompute`) everything the MLP stores (`dense_mlp_term`) and
    its fused norm's output, fc1's input, which the layer would keep otherwise (`fc1_input`, a
    replicated term: t times itself in split terms without SP, which splits only these)."""
    if "mlp" in layout.recompute_modules:
        return dense_mlp_term(model) + fc1_input(model, layout) * (1 if layout.sp else layout.tp)
    if te_fp8(model, layout):
        return te_fp8_mlp(model, layout)
    if not layout.fp8_activation_cache:
        return 0.0
    return model.ffn_hidden / model.hidden if model.ffn == "swiglu" else GELU_FC2_TERM / 2


def dense_mlp_term(model: ModelSpec) -> float:
    """The dense MLP's stored activations per s·b·h in `activation_terms`' split term (and an
    MoE layer's dense stand-in, `sim.models.moe_memory`): SwiGLU 6f/h, GeLU the literal
    GELU_FC2_TERM pair (`stored_activations.GELU_MLP_TERM`)."""
    return 6 * model.ffn_hidden / model.hidden if model.ffn == "swiglu" else 2 * GELU_FC2_TERM


def fc1_input(model: ModelSpec, layout: Layout) -> float:
    """fc1's input (the pre-MLP norm's output) per s·b·h as stored without "mlp": 2 bytes less
    half the replicated saving ("layernorm" spares both norms' outputs, the FP8 cache and
    Transformer Engine's FP8 halve or quantize both), as `stored_activations.gathered_inputs`
    counts it."""
    kept = replace(layout, recompute_modules=tuple(m for m in layout.recompute_modules
                                                   if m != "mlp"))
    return 2 - saving_terms(model, kept)[0] / 2


def moe_mlp_terms(model: ModelSpec, layout: Layout) -> tuple[float, float]:
    """(shared experts per s·b·h, routed bytes per token / value size) an MoE layer stores:
    `sim.models.moe_memory`'s 6·S·f/h and h + 3f/etp for SwiGLU (4·S·f/h, h + 2f/etp GeLU),
    halved by the FP8 cache, less fc2's input with moe_act."""
    h, swiglu = model.hidden, model.ffn == "swiglu"
    f_shared = model.shared_experts * model.moe_ffn_hidden
    f = model.moe_ffn_hidden / layout.etp
    act = "moe_act" in layout.recompute_modules
    if not act and not layout.fp8_activation_cache:
        return (6 if swiglu else 4) * f_shared / h, h + (3 if swiglu else 2) * f
    scale = 0.5 if layout.fp8_activation_cache else 1.0
    width = 2 if swiglu else 1  # the activation's input: gate and up, or fc1's output
    fc2 = 0 if act else 1
    shared = 2 * (width + fc2) * f_shared / h
    return scale * shared, scale * (h + (width + fc2) * f)
