"""Per-GPU memory of one training step: model states, stored activations, transient buffers.

Pure arithmetic on a `ModelSpec`, a `Layout` and the pipeline schedule's action lists; bytes
throughout. Model states as ZeRO shards them (Rajbhandari et al. 2020: 2Ψ + 2Ψ + 12Ψ, divided
by N as the stage says); activations per layer by Korthikanti et al. 2022 (the seeds'
34sbh + 5as²b, divided by TP, with SP, flash attention and recomputation; under context
parallelism s is the rank's s/cp tokens, and ZeRO shards over DP x CP), times the
micro-batches the schedule keeps in flight; ZeRO-3's gathered parameters as
`reshard_after_forward` holds them and gradients whole where `grad_sync = "step"` accumulates
them (`traces.fsdp`); transient buffers at that peak (not counted: CP's
K/V exchange buffers, two K/V blocks of b·(s/cp) tokens in p2p, the gathered K/V of one layer
in all_gather, a few MB against the activations' GB).

    python -c "from sim.models.memory import *; help(pp_rank_memory)"

The derivation in full: docs/memory-model.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from sim.models.deepep_buffers import deepep_buffer_bytes
from sim.models.moe_memory import (
    expert_params_on_rank,
    expert_shards,
    moe_activation_delta,
    rank_layers,
)
from sim.models.saved_activations import saving_terms
from traces import cpu_offload, op_sac
from traces.errors import ConfigError
from traces.fsdp import GradSync
from traces.layout import Layout, Recompute
from traces.model import ModelSpec
from traces.pipeline import Action, ActionSchedule, layout_schedule
from traces.recompute import optimizer_bytes, recomputes_core
from traces.zero_bubble import frees_at

OPTIMIZER_STATE_BYTES = 12
"""fp32 master weights, momentum and variance: 4 + 4 + 4 (ZeRO's K)."""
GELU_MLP_TERM = 16
"""A GeLU MLP's stored activations per s·b·h: 2·4 (GeLU input) + 2·4 (fc2 input), the paper's
f = 4h. Kept literal for any `ffn_hidden` (shipped predictions unchanged); 4f/h is the count
for another width (Llama-2-7B-shaped f = 11008, h = 4096: 10.75 instead of 16)."""
LOGITS_BYTES = 4
"""The cross-entropy reads fp32 logits (Korthikanti et al. 2022, §4.3)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Bytes one GPU holds at its peak, by kind."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    """Stored activations at the schedule's peak (in-flight micro-batches)."""
    working_bytes: float
    """Transient buffers at the peak: recomputed layer, logits, ZeRO-3 gathered weights; and
    DeepEP's communication buffers, held throughout (`sim.models.deepep_buffers`)."""

    @property
    def total_bytes(self) -> float:
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.working_bytes)


# --- model states -------------------------------------------------------------------------------

def model_state_bytes(num_params: float, dp: int, zero: int,
                      optimizer_bytes_per_param: float = OPTIMIZER_STATE_BYTES,
                      param_bytes: float = 2, grad_bytes: float = 2,
                      full_grads: bool = False) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per GPU for mixed-precision Adam under ZeRO stage `zero`
    over `dp` data-parallel ranks (ZeRO paper, Rajbhandari et al. 2020, K = 12):
    stage 0: 2Ψ + 2Ψ + KΨ; stage 1: 2Ψ + 2Ψ + KΨ/N; stage 2: 2Ψ + (2+K)Ψ/N; stage 3: (2+2+K)Ψ/N.
    `full_grads`: gradients accumulated whole and reduced once per step (`grad_sync =
    "step"`: Megatron-Core's distributed optimizer's full buffer, FSDP2's unsharded
    accumulation), 2Ψ at every stage."""
    if zero not in (0, 1, 2, 3) or isinstance(zero, bool):
        raise ConfigError(f"parallel.zero: {zero!r} must be 0, 1, 2 or 3")
    if dp < 1:
        raise ConfigError(f"parallel.dp: {dp!r} must be a positive integer")
    # Stage z shards the optimizer from z >= 1, the gradients from z >= 2, the weights at z = 3.
    params = param_bytes * num_params / (dp if zero >= 3 else 1)
    grads = grad_bytes * num_params / (dp if zero >= 2 and not full_grads else 1)
    optimizer = optimizer_bytes_per_param * num_params / (dp if zero >= 1 else 1)
    return params, grads, optimizer


# --- activations --------------------------------------------------------------------------------

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
    counted at these bf16 sizes. A context-parallel rank holds 1/cp of the sequence: both
    terms divide by cp."""
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


# --- per stage ----------------------------------------------------------------------------------

def working_bytes(model: ModelSpec, layout: Layout, pp_rank: int) -> float:
    """Transient buffers at the peak of pipeline rank `pp_rank` (see the module docstring)."""
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
        # MoE layer's with moe_act), beside what it kept (`sim.models.saved_activations`).
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
    return total + deepep_buffer_bytes(model, layout)  # 0 but with dispatch = "deepep"


def holds_head(layout: Layout, pp_rank: int) -> bool:
    """Whether pipeline rank `pp_rank` runs the last virtual stage (the head and the loss):
    rank pp - 1, but rank 0 in zbv/dualpipev's V and both ends under DualPipe's two copies."""
    return layout.num_stages - 1 in layout.stages_of_rank(pp_rank)


def zero3_working_bytes(model: ModelSpec, layout: Layout, pp_rank: int) -> float:
    """ZeRO-3's gathered parameters and unsharded gradients at the peak: two layers in 2
    bytes (computing + prefetched) and one layer's 2-byte gradients before its reduce-scatter,
    (2 * 2 + 2) * layer_params(t); with reshard_after_forward false every unit of the rank
    gathered instead (held from its forward to its backward: at the end of a forward all
    are), in the model's dtype (`gathered_params`); with grad_sync "step" no per-layer
    gradients here (the full ones are model states: `model_state_bytes`)."""
    unit = model.layer_params(layout.tp) if not model.experts else max(
        model.layer_params(layout.tp, i, layout.ep, layout.etp)
        for i in rank_layers(model, layout, pp_rank))  # FSDP+EP: its largest layer, experts
    gathered = 2 * 2 * unit if layout.reshard_after_forward else \
        model.dtype_bytes * gathered_params(model, layout, pp_rank)
    grads = 2 * unit if layout.sync is GradSync.MICROBATCH else 0.0
    return gathered + grads


def gathered_params(model: ModelSpec, layout: Layout, pp_rank: int) -> float:
    """Parameters ZeRO-3 gathers on one GPU of pipeline rank `pp_rank`: all it holds (per TP
    rank), an MoE model's routed experts gathered over expert-DP (`traces.plan.data`)."""
    return _rank_params(model, layout, pp_rank)[0]


def pp_rank_memory(model: ModelSpec, layout: Layout, pp_rank: int,
                   actions: list[Action]) -> MemoryBreakdown:
    """Peak bytes on one GPU of pipeline rank `pp_rank` running `actions` (its schedule)."""
    if not 0 <= pp_rank < layout.pp:
        raise ConfigError(f"pipeline rank {pp_rank} is outside 0..{layout.pp - 1}")
    params, grads, optimizer = _states(model, layout, pp_rank)
    chunks = chunk_bytes(model, layout, pp_rank)
    activations = (peak_in_flight(actions) * _per_pass(model, layout, pp_rank) if chunks is None
                   else max(_held(actions, chunks), default=0.0))
    return MemoryBreakdown(params_bytes=params, grads_bytes=grads, optimizer_bytes=optimizer,
                           activations_bytes=activations,
                           working_bytes=working_bytes(model, layout, pp_rank))


def _states(model: ModelSpec, layout: Layout, pp_rank: int) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes: ZeRO shards the dense states over DP x CP and an MoE
    model's routed experts over their expert-data-parallel group (`sim.models.moe_memory`)."""
    grad_bytes = 4 if layout.fp32_main_grads else model.dtype_bytes
    total, experts = _rank_params(model, layout, pp_rank)
    full = layout.sync is GradSync.STEP
    k = optimizer_bytes(layout)  # 12 unless the moments are narrower (`traces.recompute`)
    dense = model_state_bytes(total - experts, layout.data_degree, layout.zero, k,
                              param_bytes=model.dtype_bytes, grad_bytes=grad_bytes,
                              full_grads=full)
    if not experts:
        return dense
    routed = model_state_bytes(experts, expert_shards(layout), layout.zero, k,
                               param_bytes=model.dtype_bytes, grad_bytes=grad_bytes,
                               full_grads=full)
    return dense[0] + routed[0], dense[1] + routed[1], dense[2] + routed[2]


def _rank_params(model: ModelSpec, layout: Layout, pp_rank: int) -> tuple[float, float]:
    """(all, routed experts') parameters one GPU of pipeline rank `pp_rank` holds before
    ZeRO shards them."""
    total = model.params_on_stages(layout.stages_of_rank(pp_rank), layout.num_stages, layout.tp,
                                   layout.layers_of_rank(model, pp_rank),
                                   layers=rank_layers(model, layout, pp_rank), ep=layout.ep,
                                   etp=layout.etp)
    experts = expert_params_on_rank(model, layout, pp_rank) if model.experts else 0.0
    return total, experts


def chunk_bytes(model: ModelSpec, layout: Layout, pp_rank: int) -> dict[int, float] | None:
    """Stored activations of one forward pass of each of the rank's chunks, where their layer
    counts differ (account_for_embedding / account_for_loss with vp > 1, a pipeline_layout);
    None where they are equal (`_per_pass` then stands for every chunk)."""
    stages = layout.stages_of_rank(pp_rank)
    layers = {s: layout.layers_of_stage(model, s) for s in stages}
    if len({len(r) for r in layers.values()}) == 1:
        return None
    per_layer = activation_bytes_per_layer(model, layout)
    if not model.experts:
        return {s: len(r) * per_layer for s, r in layers.items()}
    return {s: sum(per_layer + moe_activation_delta(model, layout, i) for i in r)
            for s, r in layers.items()}


def _held(actions: Sequence[Action], chunks: dict[int, float]) -> list[float]:
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


def _per_pass(model: ModelSpec, layout: Layout, pp_rank: int) -> float:
    """Stored activations of one forward pass of a chunk of `pp_rank`: its layers' (an MoE
    model's, averaged over the rank's chunks)."""
    per_layer = activation_bytes_per_layer(model, layout)
    if not model.experts:
        offloaded = cpu_offload.freed_layers(layout)  # activations held in host memory
        return (layout.layers_per_chunk(model, pp_rank) - offloaded) * per_layer
    layers = rank_layers(model, layout, pp_rank)
    return sum(per_layer + moe_activation_delta(model, layout, layer)
               for layer in layers) / len(layout.stages_of_rank(pp_rank))  # vp; dualpipe 2


def memory_by_pp_rank(model: ModelSpec, layout: Layout,
                      schedule: ActionSchedule | None = None) -> list[MemoryBreakdown]:
    """One breakdown per pipeline rank, under `schedule` (default: the layout's own; pass the
    one the plan was built with rather than building it again)."""
    if schedule is None:
        schedule = layout_schedule(layout)
    return [pp_rank_memory(model, layout, r, schedule[r]) for r in range(layout.pp)]


def memory_timeline(model: ModelSpec, layout: Layout, pp_rank: int,
                    timed: Sequence[tuple[Action, float, float]]) -> list[tuple[float, float]]:
    """Bytes one GPU of pipeline rank `pp_rank` holds over the step, as (time, bytes) points of
    a step curve (each value holds until the next point), from the same accounting as
    `pp_rank_memory`: model states throughout; a micro-batch's stored activations
    (layers per virtual stage * `activation_bytes_per_layer`) from the start of its forward
    to the end of its backward; `working_bytes` while a pass runs. `timed` holds the rank's
    (action, start, end) in the order it ran them.

    The curve's highest point is `pp_rank_memory(...).total_bytes` for the same actions: the
    in-flight count peaks at the end of a forward and stays there until a backward ends, and
    that backward runs (with its working buffers) at the peak."""
    base = pp_rank_memory(model, layout, pp_rank, [])  # model states: no activations, no actions
    held = deepep_buffer_bytes(model, layout)  # working bytes, but held throughout
    states = base.params_bytes + base.grads_bytes + base.optimizer_bytes + held
    work = working_bytes(model, layout, pp_rank) - held
    chunks = chunk_bytes(model, layout, pp_rank)
    if chunks is not None:
        return _weighted_timeline(states, work, chunks, timed)
    per_pass = _per_pass(model, layout, pp_rank)
    in_flight: set[tuple[int, int]] = set()
    points = [(0.0, states)]
    frees = frees_at([action for action, _, _ in timed])
    for action, start, end in timed:
        key = (action.stage, action.microbatch)
        if action.kind == "F" or action.kind != frees:  # a pass that frees nothing
            if action.kind == "F":
                in_flight.add(key)
            points += [(start, states + len(in_flight) * per_pass + work),
                       (end, states + len(in_flight) * per_pass)]
        elif key in in_flight:
            points.append((start, states + len(in_flight) * per_pass + work))
            in_flight.remove(key)
            points.append((end, states + len(in_flight) * per_pass))
        else:
            raise ConfigError(f"schedule: {action} runs before the forward {key[0]}F{key[1]}")
    return points


def _weighted_timeline(states: float, work: float, chunks: dict[int, float],
                       timed: Sequence[tuple[Action, float, float]]
                       ) -> list[tuple[float, float]]:
    """`memory_timeline` where the rank's chunks differ: a forward adds its own chunk's bytes
    as it starts, a backward frees them as it ends."""
    held = _held([action for action, _, _ in timed], chunks)
    points, before = [(0.0, states)], 0.0
    for (action, start, end), after in zip(timed, held):
        peak = after if action.kind == "F" else before
        points += [(start, states + peak + work), (end, states + after)]
        before = after
    return points
