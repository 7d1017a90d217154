"""Attention heads as models publish them: a head width of its own and per-head q/k norms.

`head_dim` d (Megatron-Core's kv_channels, Hugging Face's head_dim) need not be h/a. Qwen3
sets it to 128 on every model (Hugging Face config.json of Qwen/Qwen3-8B: hidden_size 4096,
num_attention_heads 32, num_key_value_heads 8, head_dim 128; Qwen/Qwen3-32B: 5120, 64, 8,
128, so its query is 64 x 128 = 8192 wide, more than h). With q = ad the query's width:

    qkv     h -> q + 2gd     (q, then k and v of g heads of d each)
    core    a heads of d     (QKᵀ and AV: 2bs²q FLOPs each, scaled by 1/√d)
    proj    q -> h

so parameters, FLOPs, kernel bytes, activations and the executor's block take q where the
h/a default had h (`traces.model`, `traces.kernels`, `sim.models.memory`, `executor`).
Megatron-LM's num_floating_point_operations scales its attention term by
query_projection_to_hidden_size_ratio = kv_channels·a/h (`traces.step_flops`).

`qk_norm` normalizes each query head and each key head over its d channels after the qkv
projection and before RoPE, with the model's norm (RMSNorm for Qwen3) and one learned weight
of d shared by all query heads and one by all key heads: Qwen3's q_norm/k_norm
(Qwen3RMSNorm(head_dim) on q_proj's output viewed per head, transformers'
modeling_qwen3.py) and Megatron-Core's qk_layernorm (q_layernorm and k_layernorm built of
hidden_size_per_attention_head). OLMo 2 instead normalizes the whole q and k projections at
once (weights of ad and gd, statistics over all heads): not modelled, as it would need the
statistics summed over TP. Per layer: 2d parameters with RMSNorm (4d with LayerNorm's
biases), replicated on every TP rank; each rank's gradient covers only its heads, so
Megatron-Core all-reduces them over TP in finalize_model_grads
(_allreduce_layernorm_grads: names with q_layernorm or k_layernorm, with or without SP):
the plan's `sp_grads` (`traces.plan.nodes`). Its kernel, forward and backward, is
`qk_norm_kernel` below (a layer's kernels: `traces.kernels`); what its backward saves,
`sim.models.memory`.
"""

from __future__ import annotations

from typing import Protocol

from traces.errors import ConfigError, show
from traces.kernel_work import KernelWork, memory_kernel
from traces.purpose import Kernel

MAX_Q_WIDTH = 2**22
"""Bound on a·d, the query's width (Qwen3-32B: 8192; `traces.model`'s ffn_hidden bound)."""


class ModelSpec(Protocol):
    """What this module reads of `traces.model.ModelSpec` (which imports this module)."""

    @property
    def heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def qk_norm(self) -> bool: ...
    @property
    def mla(self) -> bool: ...
    @property
    def q_width(self) -> int: ...


class KernelModel(ModelSpec, Protocol):
    """What `qk_norm_kernel` reads besides."""

    @property
    def seq_len(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def dtype_bytes(self) -> int: ...


def check_heads(m: ModelSpec) -> None:
    """The query's width a·d bounded like the other widths (`head_dim` itself is checked with
    latent attention's widths, `traces.mla.check_mla`); `qk_norm` a boolean, and not with
    latent attention, whose own norms act on its latents."""
    if not m.mla and m.q_width > MAX_Q_WIDTH:
        raise ConfigError(f"model.head_dim: {m.head_dim} x model.heads {m.heads} = "
                          f"{m.q_width:,} query channels, more than {MAX_Q_WIDTH:,}")
    if not isinstance(m.qk_norm, bool):
        raise ConfigError(f"model.qk_norm: {show(m.qk_norm)} must be true or false")
    if m.qk_norm and m.mla:
        raise ConfigError("model.qk_norm: true: latent attention normalizes its latents "
                          "(model.kv_lora_rank), not its heads; set it false")


def qk_norm_kernel(m: KernelModel, b: int, t: int) -> KernelWork:
    """qk_norm over this rank's a/t query and g/t key heads of b·s tokens, n = b·s·(a + g)d/t
    elements, read and written once as the other norms (`traces.kernels`): fwd read x, write
    y: 2ne; bwd read x and dy, write dx: 3ne (its d-element weights and per-head statistics
    too small to count). Memory-bound; full recomputation re-runs it, selective does not."""
    n = b * m.seq_len * (m.heads + m.kv_heads) * m.head_dim // t
    return memory_kernel(Kernel.QK_NORM, 2 * n * m.dtype_bytes, 3 * n * m.dtype_bytes)
