"""An MoE model's memory beyond the dense model's: experts sharded by EP, routing buffers.

    expert_params_on_rank   the routed experts a GPU of pipeline rank p holds: per MoE layer
                            E/EP experts, each split by ETP (`traces.moe_spec.expert_params`);
                            their optimizer states shard over the expert-data-parallel group
                            (TP·CP·DP / (ETP·EP) ranks), not the whole DP group; their
                            parameters and gradients only where ZeRO 3 gathers them per use
                            (`expert_zero`)
    moe_activation_delta    stored activations of an MoE layer minus the dense layer's, for one
                            micro-batch, on the busiest EP rank (skewed routing): the dense MLP's
                            term (6f/h·sbh for SwiGLU, 16·sbh for GeLU, split by TP) goes; in
                            come the shared experts as a SwiGLU (GeLU) MLP of width S·f_moe
                            (6·S·f_moe/h, split by TP), and per routed token the expert's fc1
                            input h, its activation input (2f or f) and fc2 input f over ETP:
                            R·(h + 3f/etp)·e for SwiGLU (R·(h + 2f/etp)·e GeLU); the permutation
                            buffers: the combined expert outputs A·h·e that unpermute's
                            backward reads (with `moe_probs_in_activation` the R fp32
                            probabilities the weighted activation keeps instead,
                            `traces.moe_probs`), the router's fp32 scores T·E·4 and the 1-byte
                            routing map T·E (A kept assignments of the rank's T tokens, R the
                            tokens its experts process, `traces.moe`); recompute_modules'
                            moe_act and the FP8 activation cache shrink the experts' terms
                            (`traces.saved_activations.moe_mlp_terms`)
"""

from __future__ import annotations

from traces.expert_grid import expert_grad_degree
from traces.layout import Layout, Recompute
from traces.model import ModelSpec
from traces.moe import ExpertShard, local_expert_tokens, rank_tokens
from traces.moe_probs import combine_saved_bytes
from traces.moe_spec import expert_counts, expert_params, is_moe_layer
from traces.plan.experts import fsdp_experts
from traces.saved_activations import dense_mlp_term, mlp_saving, moe_mlp_terms
from traces.stack import regathers
from traces.stored_activations import gathered_inputs


def rank_layers(model: ModelSpec, layout: Layout, pp_rank: int) -> list[int]:
    """The layer indices pipeline rank `pp_rank` holds over all its chunks."""
    return [layer for stage in layout.stages_of_rank(pp_rank)
            for layer in layout.layers_of_stage(model, stage)]


def expert_params_on_rank(model: ModelSpec, layout: Layout, pp_rank: int) -> float:
    return sum(layer_expert_params(model, layout, layer)
               for layer in rank_layers(model, layout, pp_rank))


def layer_expert_params(model: ModelSpec, layout: Layout, layer: int) -> float:
    """The routed experts' parameters one GPU holds of `layer` (0 for a dense layer)."""
    if not is_moe_layer(model, layer):
        return 0.0
    return model.experts / layout.ep * expert_params(model) / layout.etp


def expert_zero(layout: Layout) -> int:
    """The ZeRO stage the routed experts' states are held at: 3 where the plan gathers them
    per use (FSDP with EP over DP of two or more, `traces.plan.experts.fsdp_experts`; over an
    expert-DP group of one they are whole all the same); elsewhere the plan reduces their
    gradients once, after the step's last backward (`traces.plan.experts.add_expert_grads`,
    at ZeRO 2 and at ZeRO 3 with DP 1 too), so parameters and gradients are held whole and
    only the optimizer shards: stage 1 (0 at ZeRO 0)."""
    return 3 if fsdp_experts(layout) else min(layout.zero, 1)


def gathers_experts(layout: Layout) -> bool:
    """Whether ZeRO 3 all-gathers the routed experts per use (`traces.plan.data`): FSDP with
    EP over an expert-DP group of two or more; else they stay whole in the model states."""
    return fsdp_experts(layout) and expert_shards(layout) > 1


def expert_shards(layout: Layout) -> int:
    """Ranks over which ZeRO shards the experts' states: the expert-data-parallel group (and
    DualPipe's pair: `traces.expert_grid.expert_grad_degree`)."""
    return expert_grad_degree(layout)


def moe_activation_delta(model: ModelSpec, layout: Layout, layer: int) -> float:
    """Module docstring; 0 for a dense layer, and under full recomputation (only the layer's
    input is kept, as for a dense layer)."""
    if not is_moe_layer(model, layer) or layout.recompute is Recompute.FULL:
        return 0.0
    b, t, e, h = layout.micro_batch, layout.tp, model.dtype_bytes, model.hidden
    s = model.seq_len // layout.cp
    sbh = s * b * h
    dense = dense_mlp_term(model) - mlp_saving(model, layout)
    shared, per_token = moe_mlp_terms(model, layout)  # the FP8 cache, moe_act
    local = model.seq_len // layout.cp
    shaped = model if layout.cp == 1 else _with_seq(model, local)
    tokens = rank_tokens(shaped, b, t)
    kept = sum(expert_counts(model, layer, tokens))
    received = max(sum(local_expert_tokens(model, layer, tokens,
                                           ExpertShard(ep=layout.ep, etp=layout.etp,
                                                       ep_rank=r)))
                   for r in range(layout.ep))
    weighed = combine_saved_bytes(model, kept, received)  # `traces.moe_probs`
    routed = received * per_token * e + weighed + tokens * model.experts * (4 + 1)
    if layout.sp and not regathers(model):  # no dense fc1 input gathered whole (DTensor)
        dense += gathered_inputs(model, layout)[1] * (t - 1)
    return sbh * (shared - dense) / t + routed


def _with_seq(model: ModelSpec, seq_len: int) -> ModelSpec:
    import dataclasses
    return dataclasses.replace(model, seq_len=seq_len)
