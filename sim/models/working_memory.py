"""Transient buffers of one GPU at its peak, beside the model states and stored activations:
the layer recomputed in backward, the logits, ZeRO-3's gathered weights and unsharded
gradients, and the expert dispatcher's communication buffers (DeepEP's, HybridEP's), which
are held throughout the step.

Split from `sim.models.memory`, which adds them to the rest.
"""

from __future__ import annotations

import dataclasses

from sim.models.deepep_buffers import deepep_buffer_bytes
from sim.models.hybridep_buffers import hybridep_layout_bytes
from sim.models.moe_memory import (
    expert_params_on_rank,
    gathers_experts,
    layer_expert_params,
    moe_activation_delta,
    rank_layers,
)
from traces import op_sac
from traces.fsdp import GradSync
from traces.layout import Layout, Recompute
from traces.model import ModelSpec
from traces.stored_activations import activation_bytes_per_layer

LOGITS_BYTES = 4
"""The cross-entropy reads fp32 logits (Korthikanti et al. 2022, §4.3)."""


def working_bytes(model: ModelSpec, layout: Layout, pp_rank: int,
                  nvlink_domain: int | None = None) -> float:
    """Transient buffers at the peak of pipeline rank `pp_rank` (see the module docstring);
    `nvlink_domain` GPUs per NVLink domain (`dispatch_buffer_bytes`)."""
    t, total = layout.tp, 0.0
    if layout.recompute == Recompute.FULL:
        # The layer re-run in backward holds all its activations, as if not recomputed
        # (an MoE model: its largest layer, with the busiest EP rank's routed tokens).
        kept = dataclasses.replace(layout, recompute=Recompute.NONE)
        total += activation_bytes_per_layer(model, kept) + max(
            (moe_activation_delta(model, kept, layer)
             for layer in rank_layers(model, layout, pp_rank)), default=0.0)
    if layout.recompute == Recompute.SELECTIVE_OP:
        # The layer re-run in backward holds what it did not save, beside what it did.
        kept = dataclasses.replace(layout, recompute=Recompute.NONE)
        total += max(activation_bytes_per_layer(model, kept) - op_sac.saved_bytes(model, layout),
                     0.0)
    if layout.recompute_modules:
        # The layer re-run in backward re-creates what its modules discarded (its busiest
        # MoE layer's with moe_act), beside what it kept (`traces.saved_activations`).
        kept = dataclasses.replace(layout, recompute=Recompute.NONE, recompute_modules=())
        moe = max((moe_activation_delta(model, kept, i) - moe_activation_delta(model, layout, i)
                   for i in rank_layers(model, layout, pp_rank)), default=0.0)
        total += activation_bytes_per_layer(model, kept) - \
            activation_bytes_per_layer(model, layout) + moe
    if holds_head(layout, pp_rank):
        # fp32 logits of one micro-batch, vocab-parallel: 4 * s * b * V / t.
        total += LOGITS_BYTES * model.seq_len // layout.cp * layout.micro_batch * model.vocab / t
    if layout.zero == 3:
        total += zero3_working_bytes(model, layout, pp_rank)
    if layout.zero == 2 and layout.sync is GradSync.MICROBATCH:
        total += zero2_working_bytes(model, layout, pp_rank)
    return total + dispatch_buffer_bytes(model, layout, nvlink_domain)


def dispatch_buffer_bytes(model: ModelSpec, layout: Layout, nvlink_domain: int | None) -> int:
    """The expert dispatcher's communication buffers one GPU holds for the whole run: DeepEP's
    (`sim.models.deepep_buffers`) or HybridEP's, sized by the NVLink domain of
    `nvlink_domain` GPUs (`sim.models.hybridep_buffers`; None: a server's 8); 0 with NCCL."""
    return deepep_buffer_bytes(model, layout) + \
        hybridep_layout_bytes(model, layout, nvlink_domain)


def holds_head(layout: Layout, pp_rank: int) -> bool:
    """Whether pipeline rank `pp_rank` runs the last virtual stage (the head and the loss):
    rank pp - 1, but rank 0 in zbv/dualpipev's V and both ends under DualPipe's two copies."""
    return layout.num_stages - 1 in layout.stages_of_rank(pp_rank)


def zero3_working_bytes(model: ModelSpec, layout: Layout, pp_rank: int) -> float:
    """ZeRO-3's gathered parameters and unsharded gradients at the peak: two layers
    (computing + prefetched) and one layer's gradients before its reduce-scatter, each in the
    model's dtype as the plan gathers them, (2 + 1) * w * layer_params(t) (w = 2 in bf16 and
    FP8); with reshard_after_forward false every unit of the rank gathered instead (held from
    its forward to its backward: at the end of a forward all are) (`gathered_params`); with
    grad_sync "step" no per-layer gradients here (the full ones are model states:
    `model_state_bytes`). Only what the plan
    gathers (`traces.plan.data`): nothing with DP 1, and an MoE layer's routed experts only
    over an expert-DP group of two or more (else whole in the model states)."""
    if layout.data_degree == 1:
        return 0.0
    unit = model.layer_params(layout.tp) if not model.experts else max(
        model.layer_params(layout.tp, i, layout.ep, layout.etp) - _kept_experts(model, layout, i)
        for i in rank_layers(model, layout, pp_rank))  # FSDP+EP: its largest layer, experts
    width = model.dtype_bytes
    gathered = 2 * width * unit if layout.reshard_after_forward else \
        width * gathered_params(model, layout, pp_rank)
    grads = width * unit if layout.sync is GradSync.MICROBATCH else 0.0
    return gathered + grads


def _kept_experts(model: ModelSpec, layout: Layout, layer: int) -> float:
    """The routed experts of `layer` ZeRO 3 keeps whole rather than gathering (expert-DP 1)."""
    return 0.0 if gathers_experts(layout) else layer_expert_params(model, layout, layer)


def zero2_working_bytes(model: ModelSpec, layout: Layout, pp_rank: int) -> float:
    """ZeRO-2's gradients reduced every micro-batch: a bucket's whole gradients are held
    until their reduce-scatter has summed them into the rank's shard (ZeRO paper §5.2,
    gradients bucketed and reduced per partition, then released). The largest bucket the
    rank fills, by `traces.plan.data.gradient_buckets`' rule over its layers (a chunk's
    layers, last first, until `bucket_bytes`; a chunk closes its last), in the reduced dtype:
    4 bytes with fp32 main gradients (the fp32 reduce-scatter's input), else the model's. An
    MoE layer's routed experts are not in it: ZeRO 2 reduces them once per step, whole in the
    model states (`sim.models.moe_memory`)."""
    width = 4 if layout.fp32_main_grads else model.dtype_bytes
    largest = 0.0
    for stage in layout.stages_of_rank(pp_rank):
        filled = 0.0
        for layer in reversed(layout.layers_of_stage(model, stage)):
            filled += width * (model.layer_params(layout.tp) if not model.experts else
                               model.layer_params(layout.tp, layer, layout.ep, layout.etp)
                               - layer_expert_params(model, layout, layer))
            largest = max(largest, filled)
            if filled >= layout.bucket_bytes:
                filled = 0.0
    return largest


def gathered_params(model: ModelSpec, layout: Layout, pp_rank: int) -> float:
    """Parameters ZeRO-3 gathers on one GPU of pipeline rank `pp_rank`: all it holds (per TP
    rank), an MoE model's routed experts gathered over expert-DP where that group has two
    or more ranks (`traces.plan.data`)."""
    total, experts = rank_params(model, layout, pp_rank)
    return total if gathers_experts(layout) else total - experts


def rank_params(model: ModelSpec, layout: Layout, pp_rank: int) -> tuple[float, float]:
    """(all, routed experts') parameters one GPU of pipeline rank `pp_rank` holds before
    ZeRO shards them."""
    total = model.params_on_stages(layout.stages_of_rank(pp_rank), layout.num_stages, layout.tp,
                                   layout.layers_of_rank(model, pp_rank),
                                   layers=rank_layers(model, layout, pp_rank), ep=layout.ep,
                                   etp=layout.etp)
    experts = expert_params_on_rank(model, layout, pp_rank) if model.experts else 0.0
    return total, experts
