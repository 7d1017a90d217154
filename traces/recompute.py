"""Recomputation and low-precision storage of activations: `[parallel] recompute`,
`recompute_modules`, `fp8_activation_cache` and the optimizer moments' dtypes.

`recompute_modules` is Megatron-Core's --recompute-modules (megatron/core/transformer/
transformer_config.py, `recompute_modules`; valid with --recompute-granularity selective,
default ["core_attn"]). Of its names parasim models the four DeepSeek-V3 needs (DeepSeek-AI,
"DeepSeek-V3 Technical Report", arXiv 2412.19437, §3.2.3: "we recompute all RMSNorm
operations and MLA up-projections during back-propagation"; §3.3.2: "we cache the inputs of
the SwiGLU operator and recompute its output in the backward pass"):

    core_attn    the attention core (what `recompute = "selective"` alone means)
    layernorm    input_layernorm and pre_mlp_layernorm: their outputs are not stored
    mla_up_proj  the latents' norms, the q and kv up-projections and RoPE: Q, K, V and the
                 normalized latents are not stored
    moe_act      the MoE's activation function (routed and shared experts): fc2's input is
                 not stored

    mlp          a dense layer's MLP checkpointed whole (Megatron-Core transformer_layer.py:
                 `if "mlp" in recompute_modules: if not is_moe_layer: recompute_mlp = True`,
                 then `tensor_parallel.checkpoint(self.mlp, ...)`; an MoE layer's is "moe"):
                 the MLP as its Transformer Engine spec builds it (the pre-MLP norm fused
                 into linear_fc1, TELayerNormColumnParallelLinear; pre_mlp_layernorm an
                 IdentityOp) runs its forward again before its backward: the norm, fc1 with
                 its FP8 cast and SP all-gather, the activation, fc2 with its cast and SP
                 reduce-scatter. It stores only its input (the residual stream, the norm's
                 input, kept anyway): the norm's output (fc1's input) and everything inside
                 the MLP are not stored. Used by Megatron-Bridge's H100 DeepSeek-V3 recipe.

"moe" and "shared_experts" (checkpointing an MoE layer's experts, with the dispatch and combine
all-to-alls run again) are refused. The recomputed kernels run again before the layer's backward
(`recomputed_kernels`); the TP collectives around them are placed in the recompute phase as in
the forward (`traces.plan.tensor`); the bytes they spare are `traces.saved_activations`'.

`fp8_activation_cache` (DeepSeek-V3 §3.3.2, "Low-Precision Storage"; Transformer Engine's FP8
linears save their quantized input unless `save_original_input`): every linear layer's input is
kept for the backward in FP8 (1 byte), the attention output that feeds the output projection in
DeepSeek's E5M6 (12 bits), the MoE SwiGLU's inputs in FP8 too.

`exp_avg_dtype` / `exp_avg_sq_dtype` (Megatron-Core's --exp-avg-dtype, --exp-avg-sq-dtype of
its precision-aware optimizer): Adam's two moments in fp32, bf16, fp16 or fp8; DeepSeek-V3
keeps them in bf16 with fp32 master weights (§3.3.2).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from traces.errors import ConfigError, show
from traces.fields import check_bool, check_choice
from traces.kernel_work import KernelWork
from traces.purpose import Kernel


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    SELECTIVE_OP = "selective_op"
    """torchtitan's per-op rule (`traces.op_sac`): saves every other matmul's output."""


class Layout(Protocol):
    """The `traces.layout.Layout` fields read here (a protocol: that module imports this)."""

    @property
    def recompute(self) -> Recompute: ...
    @property
    def recompute_modules(self) -> tuple[str, ...]: ...
    @property
    def fp8_activation_cache(self) -> bool: ...
    @property
    def exp_avg_dtype(self) -> str: ...
    @property
    def exp_avg_sq_dtype(self) -> str: ...


class ModelSpec(Protocol):
    """The `traces.model.ModelSpec` properties read here."""

    @property
    def mla(self) -> bool: ...
    @property
    def experts(self) -> int: ...
    @property
    def fp8(self) -> bool: ...


MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
"""Megatron-Core's recompute_modules choices, in its order."""
MODELLED = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp")
MOMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per value of each --exp-avg-dtype / --exp-avg-sq-dtype choice."""
MASTER_BYTES = 4
"""fp32 master weights (Megatron-Core's --main-params-dtype default)."""

K = Kernel
RECOMPUTED = {"layernorm": frozenset({K.LN1, K.LN2}),
              "mla_up_proj": frozenset({K.LATENT_NORM, K.Q_UP, K.KV_UP, K.ROPE})}
"""The forward kernels each output-discarding module runs again (moe_act: `_moe_act`)."""
CAST_FOR = {"layernorm": frozenset({K.QKV, K.MLA_DOWN, K.FC1}),
            "mla_up_proj": frozenset({K.Q_UP, K.KV_UP})}
"""The GEMMs whose FP8 input cast runs again with each module (their input is recomputed)."""
DENSE_MLP = frozenset({K.LN2, K.FC1, K.SWIGLU, K.GELU, K.FC2})
"""A dense layer's MLP as "mlp" re-runs it: the pre-MLP norm (fused into linear_fc1 in the
Transformer Engine spec), fc1, the activation, fc2."""


def check_options(layout: Layout) -> None:
    """The rules that need no model: known, modelled, distinct modules under "selective";
    moment dtypes by name; `recompute_modules` stored as a tuple."""
    modules = layout.recompute_modules
    if not isinstance(modules, (list, tuple)) or not all(isinstance(m, str) for m in modules):
        raise ConfigError(f"parallel.recompute_modules: {show(modules)} must be a list of "
                          f"module names ({', '.join(MODULES)})")
    object.__setattr__(layout, "recompute_modules", tuple(modules))
    for name in modules:
        check_choice(name, "parallel.recompute_modules", list(MODULES))
        if name not in MODELLED:
            raise ConfigError(f"parallel.recompute_modules: {show(name)} is not modelled "
                              f"(modelled: {', '.join(MODELLED)})")
    if len(set(modules)) != len(modules):
        raise ConfigError(f"parallel.recompute_modules: {show(list(modules))} names a module "
                          "twice")
    if modules and layout.recompute is not Recompute.SELECTIVE:
        raise ConfigError(f"parallel.recompute_modules: needs recompute = \"selective\", not "
                          f"{show(str(layout.recompute))} (Megatron-Core's rule)")
    for key in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        check_choice(getattr(layout, key), f"parallel.{key}", list(MOMENT_BYTES))
    check_bool(layout.fp8_activation_cache, "parallel.fp8_activation_cache")


def check_with_model(model: ModelSpec, layout: Layout) -> None:
    """The rules that need the model: mla_up_proj with latent attention, moe_act with
    experts, the FP8 cache with an FP8 model."""
    if "mla_up_proj" in layout.recompute_modules and not model.mla:
        raise ConfigError("parallel.recompute_modules: \"mla_up_proj\" needs latent attention "
                          "(model.kv_lora_rank > 0)")
    if "moe_act" in layout.recompute_modules and not model.experts:
        raise ConfigError("parallel.recompute_modules: \"moe_act\" needs experts "
                          "(model.experts > 0)")
    if layout.fp8_activation_cache and not model.fp8:
        raise ConfigError("parallel.fp8_activation_cache: true needs model.dtype = \"fp8\"")


def recomputes_core(layout: Layout) -> bool:
    """Whether the attention core is recomputed: "selective" alone, or with core_attn listed."""
    return layout.recompute is Recompute.SELECTIVE and (
        not layout.recompute_modules or "core_attn" in layout.recompute_modules)


def optimizer_bytes(layout: Layout) -> int:
    """Adam's state per parameter: fp32 master weights and the two moments in their dtypes
    (12 at the defaults, ZeRO's K)."""
    return MASTER_BYTES + MOMENT_BYTES[layout.exp_avg_dtype] + \
        MOMENT_BYTES[layout.exp_avg_sq_dtype]


def recomputed_kernels(layer: list[KernelWork], modules: tuple[str, ...],
                       moe: bool) -> list[KernelWork]:
    """The forward kernels of `layer` (in forward order) that the output-discarding modules
    run again in backward: each module's kernels, the FP8 casts of the GEMMs whose input they
    recompute, with moe_act (an MoE layer) the experts' activations and fc2's cast, and with
    mlp (a dense layer) its whole MLP (`DENSE_MLP`) with fc1's and fc2's casts."""
    names: set[Kernel] = set()
    casts: set[Kernel] = set()
    for module in modules:
        names |= RECOMPUTED.get(module, frozenset())
        casts |= CAST_FOR.get(module, frozenset())
    if "moe_act" in modules and moe:
        names |= {K.EXPERT_ACT, K.SWIGLU, K.GELU}
        casts |= {K.FC2}
    if "mlp" in modules and not moe:
        names |= DENSE_MLP
        casts |= {K.FC1, K.FC2}
    out = []
    for i, k in enumerate(layer):
        following = layer[i + 1].name if i + 1 < len(layer) else None
        if k.name in names or (k.name is K.FP8_CAST and following in casts):
            out.append(k)
    return out
