"""Where an MoE layer weighs the routed experts' outputs by their routing probabilities, and
what that keeps for backward (`[model] moe_probs_in_activation`).

    false   the unpermute (combine) weighs the A kept rows: moe_utils.unpermute(..., probs)
            multiplies permuted_tokens by permuted_probs, so autograd keeps the A·h·e expert
            outputs for the probabilities' gradient until backward (TE's fused moe_unpermute
            with merging_probs keeps its input alike); Megatron-Core <= 0.12.0
    true    the experts' activation weighs the R rows a rank's experts process, fc2's input
            (Megatron-Core 0.13.0 CHANGELOG: "moving the probs multiplication from
            unpermutation to activation function of GroupedMLP"; token_dispatcher.py calls
            unpermute without probs, and its scatter_add keeps only the indices). The weighted
            SwiGLU (fusions/fused_bias_swiglu.py, WeightedSwiGLUFunction) keeps its input,
            counted already, and the R fp32 probabilities; no option turns it off. First
            shipped in 0.12.1, a backport to the core_r0.12.0 branch: PyPI's megatron-core
            wheels, 0.12.0 (dist-info dated 2025-05-06) still pass probs=self.probs to the
            MoEAlltoAllTokenDispatcher's unpermute (token_dispatcher.py:645), 0.12.1
            (2025-05-23) passes none and its experts.py has activation_func_with_probs and
            TEGroupedMLP's weighted_bias_swiglu_impl; so every Megatron-LM main from late May
            2025 on weighs in the activation

Megatron-Core's `moe_apply_probs_on_input` (fc1's input weighed instead) asserts top-1 routing
and is not modelled. The multiply's FLOPs are elementwise, not model FLOPs; its bytes move from
the unpermute (`traces.moe_steps.unpermute_steps`) to the activation (`traces.moe`).
"""

from __future__ import annotations

from traces.model import ModelSpec

PROB_BYTES = 4
"""A routing probability, fp32 (Megatron-Core's --moe-router-dtype fp32, DeepEP's only dtype)."""


def combine_saved_bytes(model: ModelSpec, kept: int, received: int) -> float:
    """Bytes the probability multiply keeps for backward on one rank (module docstring): the
    A = `kept` expert output rows of h values, or the R = `received` probabilities."""
    if model.moe_probs_in_activation:
        return float(received * PROB_BYTES)
    return float(kept * model.hidden * model.dtype_bytes)


def activation_prob_bytes(model: ModelSpec, received: int) -> tuple[float, float]:
    """(forward, backward) HBM bytes the weighted activation adds: the R probabilities read,
    and in backward read again with their gradients written; none when the unpermute weighs."""
    if not model.moe_probs_in_activation:
        return 0.0, 0.0
    return float(received * PROB_BYTES), float(2 * received * PROB_BYTES)
