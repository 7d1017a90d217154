"""The plan's kernels in groups: a layer's in forward order (per attention, FFN and latent
attention), the attention cores, the embedding's and the output layer's, FP8's and MoE's
kernels and the end of the step's. The kernels themselves are `traces.purpose.Kernel`."""

from __future__ import annotations

from traces.purpose import Kernel

K = Kernel
FLASH_CORE = (K.FLASH_ATTN,)
UNFUSED_CORE = (K.QK, K.SOFTMAX, K.ATTN_DROPOUT, K.AV)
MOE = (K.ROUTER, K.TOPK, K.AUX_LOSS, K.PERMUTE, K.EXPERT_FC1, K.EXPERT_ACT, K.EXPERT_FC2,
       K.UNPERMUTE)
ATTENTION_CORE: dict[str, tuple[Kernel, ...]] = {"flash": FLASH_CORE, "unfused": UNFUSED_CORE}
"""The attention core per `ModelSpec.attention` (what selective recomputation re-runs)."""


FP8_KERNELS = frozenset({K.FP8_AMAX, K.FP8_CAST, K.FP8_CAST_GRAD, K.FP8_WEIGHT_CAST,
                         K.EXPERT_CAST, K.EXPERT_CAST_GRAD})
"""The kernels only an FP8 model runs (the executor runs none: FP8 is GPU-only)."""


MTP_KERNELS = frozenset({K.MTP_ENORM, K.MTP_HNORM, K.MTP_CONCAT, K.EH_PROJ})
"""A multi-token prediction depth's own kernels (`traces.mtp_kernels`; simulated, not run)."""


MLA_PROJECTIONS = (K.MLA_DOWN, K.LATENT_NORM, K.Q_UP, K.KV_UP)
"""Latent attention's projections in forward order, in place of qkv (`traces.mla`)."""


def layer_kernels(attention: str, *, rope: bool = False, ffn: str = "gelu", mla: bool = False,
                  dropout: bool = True, qk_norm: bool = False) -> tuple[Kernel, ...]:
    """One layer's kernels in forward order (without FP8's casts); `mla` (latent attention,
    which always has rope) replaces qkv by its projections; without `dropout` the unfused
    core runs no attn_dropout; `qk_norm` follows qkv (`traces.heads`)."""
    projections = MLA_PROJECTIONS if mla else (K.QKV, *((K.QK_NORM,) if qk_norm else ()))
    core = tuple(k for k in ATTENTION_CORE[attention] if dropout or k is not K.ATTN_DROPOUT)
    return (K.LN1, *projections, *((K.ROPE,) if rope or mla else ()), *core,
            K.PROJ, K.BDA1, K.LN2, K.FC1, K.SWIGLU if ffn == "swiglu" else K.GELU, K.FC2,
            K.BDA2)


LAYER_FLASH = layer_kernels("flash")
LAYER_UNFUSED = layer_kernels("unfused")
CORE_KERNELS = frozenset(FLASH_CORE + UNFUSED_CORE)
LAYER_KERNELS = frozenset(LAYER_FLASH + LAYER_UNFUSED + MLA_PROJECTIONS) | {
    K.ROPE, K.QK_NORM, K.SWIGLU, K.FP8_AMAX, K.FP8_CAST, K.FP8_CAST_GRAD, K.EXPERT_CAST,
    K.EXPERT_CAST_GRAD, *MOE}
FIRST_STAGE = (K.EMBED, K.POS_EMBED)
"""The embedding's kernels, forward order (first virtual stage)."""
LAST_STAGE = (K.FINAL_LN, K.LOGITS, K.CROSS_ENTROPY)
"""The output layer's kernels, forward order (last virtual stage)."""
KERNEL_NAMES = tuple(str(k) for k in Kernel)
STEP_KERNELS = (K.GRAD_UNSCALE, K.GRAD_NORM, K.GRAD_CLIP, K.OPTIMIZER)
GRAD_STORE_KERNELS = frozenset({K.GRAD_ACCUM, K.TP_PARTIAL_SUM, K.FSDP_COPY_OUT, K.FSDP_RS_COPY_IN,
                                K.CP_MERGE, K.TP_SHARD_COPY})
"""Kernels whose work the executor's gradient store does as it accumulates (no torch function
of their own): FSDP2's accumulation of unsharded gradients (`traces.fsdp_kernels`); and
AsyncTP's sum of partial sums, which the executor's reduce-scatter chunks already do. Also
FSDP2's copy-out of a gathered unit: the executor's gather writes the parameters in place, and
its reduce-scatter copy-in: the executor's store hands its gradients to the reduce-scatter. And
context parallelism's merges (`Kernel.CP_MERGE`): the executor's CP attention merges within.
And DTensor's chunk + cat around a sequence-sharded TP collective (`Kernel.TP_SHARD_COPY`): the
executor keeps activations sequence first ([s, b, h], Megatron's layout), so its TP collectives
gather and scatter along dim 0 and need no copy."""
"""The kernels of the end of the step (phase opt), in order; once per step, not per layer."""
