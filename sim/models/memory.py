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
in all_gather, a few MB against the activations' GB). The activations live in
`sim.models.activation_memory`, the transient buffers (the expert dispatcher's among them) in
`sim.models.working_memory`; this module adds them up per pipeline rank and over the step.

    python -c "from sim.models.memory import *; help(pp_rank_memory)"

The derivation in full: docs/memory-model.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.models.activation_memory import (
    chunk_bytes,
    held_after,
    paired_levels,
    peak_in_flight,
    per_pass,
)
from sim.models.fp8_weight_cache import fp8_weight_cache_bytes
from sim.models.moe_memory import expert_shards, expert_zero
from sim.models.working_memory import (
    LOGITS_BYTES,
    dispatch_buffer_bytes,
    gathered_params,
    holds_head,
    rank_params,
    working_bytes,
    zero3_working_bytes,
)
from traces.errors import ConfigError
from traces.fsdp import GradSync
from traces.layout import Layout
from traces.model import ModelSpec
from traces.pipeline import Action, ActionSchedule, layout_schedule
from traces.recompute import optimizer_bytes
from traces.stored_activations import (
    GELU_MLP_TERM,
    activation_bytes_per_layer,
    activation_terms,
    latent_term,
)
from traces.zero_bubble import frees_at

__all__ = [
    "GELU_MLP_TERM", "LOGITS_BYTES", "OPTIMIZER_STATE_BYTES", "MemoryBreakdown",
    "activation_bytes_per_layer", "activation_terms", "chunk_bytes", "gathered_params",
    "holds_head", "latent_term", "memory_by_pp_rank", "memory_timeline", "model_state_bytes",
    "peak_in_flight", "pp_rank_memory", "working_bytes", "zero3_working_bytes",
]
"""What this module has always offered, its activations and working buffers re-exported from
the modules they now live in (`sim.models.activation_memory`, `sim.models.working_memory`)."""

OPTIMIZER_STATE_BYTES = 12
"""fp32 master weights, momentum and variance: 4 + 4 + 4 (ZeRO's K)."""


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
    the expert dispatcher's communication buffers, held throughout
    (`sim.models.working_memory.dispatch_buffer_bytes`), and so are Transformer Engine's
    cached FP8 weights (`sim.models.fp8_weight_cache`)."""

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


# --- per pipeline rank --------------------------------------------------------------------------

def pp_rank_memory(model: ModelSpec, layout: Layout, pp_rank: int,
                   actions: list[Action], nvlink_domain: int | None = None,
                   non_tn: bool = False) -> MemoryBreakdown:
    """Peak bytes on one GPU of pipeline rank `pp_rank` running `actions` (its schedule);
    `nvlink_domain`: GPUs per NVLink domain (the cluster's server), which sizes HybridEP's
    buffers (`sim.models.working_memory.dispatch_buffer_bytes`); `non_tn`: the accelerator's
    FP8 GEMMs take every layout (Blackwell), which sizes TE's cached FP8 weights
    (`sim.models.fp8_weight_cache`: working bytes held all step; the params themselves
    with `fp8_param_gather`)."""
    if not 0 <= pp_rank < layout.pp:
        raise ConfigError(f"pipeline rank {pp_rank} is outside 0..{layout.pp - 1}")
    params, grads, optimizer = _states(model, layout, pp_rank)
    in_params, held = _weight_cache(model, layout, pp_rank, non_tn)
    activations = _peak_activations(model, layout, pp_rank, actions)
    return MemoryBreakdown(params_bytes=params + in_params, grads_bytes=grads,
                           optimizer_bytes=optimizer, activations_bytes=activations,
                           working_bytes=working_bytes(model, layout, pp_rank, nvlink_domain)
                           + held)


def _peak_activations(model: ModelSpec, layout: Layout, pp_rank: int,
                      actions: list[Action]) -> float:
    """The most stored activations the rank holds along `actions`: micro-batches in flight
    times a pass's bytes, each chunk's own where they differ, and Megatron-Core's combined
    1F1B pairs layer by layer (`sim.models.activation_memory.paired_levels`)."""
    levels = paired_levels(model, layout, pp_rank, actions)
    if levels is not None:
        return max(during for during, _ in levels)
    chunks = chunk_bytes(model, layout, pp_rank)
    if chunks is None:
        return peak_in_flight(actions) * per_pass(model, layout, pp_rank)
    return max(held_after(actions, chunks), default=0.0)


def _weight_cache(model: ModelSpec, layout: Layout, pp_rank: int,
                  non_tn: bool) -> tuple[float, float]:
    """(params, working) bytes of TE's FP8 weight copies (`sim.models.fp8_weight_cache`):
    the parameters themselves with `fp8_param_gather`, else a workspace held all step
    (not checkpointed, so not with the params)."""
    cache = fp8_weight_cache_bytes(model, layout, pp_rank, non_tn)
    return (cache, 0.0) if layout.fp8_param_gather else (0.0, cache)


def _states(model: ModelSpec, layout: Layout, pp_rank: int) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes: ZeRO shards the dense states over DP x CP and an MoE
    model's routed experts over their expert-data-parallel group, at the stage the plan holds
    them (`sim.models.moe_memory.expert_zero`)."""
    grad_bytes = 4 if layout.fp32_main_grads else model.dtype_bytes
    total, experts = rank_params(model, layout, pp_rank)
    full = layout.sync is GradSync.STEP
    k = optimizer_bytes(layout)  # 12 unless the moments are narrower (`traces.recompute`)
    dense = model_state_bytes(total - experts, layout.data_degree, layout.zero, k,
                              param_bytes=model.dtype_bytes, grad_bytes=grad_bytes,
                              full_grads=full)
    if not experts:
        return dense
    routed = model_state_bytes(experts, expert_shards(layout), expert_zero(layout), k,
                               param_bytes=model.dtype_bytes, grad_bytes=grad_bytes,
                               full_grads=full)
    return dense[0] + routed[0], dense[1] + routed[1], dense[2] + routed[2]


def memory_by_pp_rank(model: ModelSpec, layout: Layout,
                      schedule: ActionSchedule | None = None,
                      nvlink_domain: int | None = None,
                      non_tn: bool = False) -> list[MemoryBreakdown]:
    """One breakdown per pipeline rank, under `schedule` (default: the layout's own; pass the
    one the plan was built with rather than building it again), `nvlink_domain` GPUs per
    NVLink domain, `non_tn` Blackwell's FP8 GEMM layouts (`pp_rank_memory`)."""
    if schedule is None:
        schedule = layout_schedule(layout)
    return [pp_rank_memory(model, layout, r, schedule[r], nvlink_domain, non_tn)
            for r in range(layout.pp)]


def memory_timeline(model: ModelSpec, layout: Layout, pp_rank: int,
                    timed: Sequence[tuple[Action, float, float]],
                    nvlink_domain: int | None = None,
                    non_tn: bool = False) -> list[tuple[float, float]]:
    """Bytes one GPU of pipeline rank `pp_rank` holds over the step, as (time, bytes) points of
    a step curve (each value holds until the next point), from the same accounting as
    `pp_rank_memory`: model states throughout; a micro-batch's stored activations
    (layers per virtual stage * `activation_bytes_per_layer`) from the start of its forward
    to the end of its backward; `working_bytes` while a pass runs. `timed` holds the rank's
    (action, start, end) in the order it ran them.

    The curve's highest point is `pp_rank_memory(...).total_bytes` for the same actions: the
    in-flight count peaks at the end of a forward and stays there until a backward ends, and
    that backward runs (with its working buffers) at the peak."""
    # model states: no activations, no actions
    base = pp_rank_memory(model, layout, pp_rank, [], non_tn=non_tn)
    held: float = dispatch_buffer_bytes(model, layout, nvlink_domain)  # working, held all step
    work = working_bytes(model, layout, pp_rank, nvlink_domain) - held
    held += _weight_cache(model, layout, pp_rank, non_tn)[1]  # so is TE's FP8 workspace
    states = base.params_bytes + base.grads_bytes + base.optimizer_bytes + held
    levels = paired_levels(model, layout, pp_rank, [action for action, _, _ in timed])
    if levels is not None:
        return _level_timeline(states, work, levels, timed)
    chunks = chunk_bytes(model, layout, pp_rank)
    if chunks is not None:
        return _weighted_timeline(states, work, chunks, timed)
    one_pass = per_pass(model, layout, pp_rank)
    in_flight: set[tuple[int, int]] = set()
    points = [(0.0, states)]
    frees = frees_at([action for action, _, _ in timed])
    for action, start, end in timed:
        key = (action.stage, action.microbatch)
        if action.kind == "F" or action.kind != frees:  # a pass that frees nothing
            if action.kind == "F":
                in_flight.add(key)
            points += [(start, states + len(in_flight) * one_pass + work),
                       (end, states + len(in_flight) * one_pass)]
        elif key in in_flight:
            points.append((start, states + len(in_flight) * one_pass + work))
            in_flight.remove(key)
            points.append((end, states + len(in_flight) * one_pass))
        else:
            raise ConfigError(f"schedule: {action} runs before the forward {key[0]}F{key[1]}")
    return points


def _weighted_timeline(states: float, work: float, chunks: dict[int, float],
                       timed: Sequence[tuple[Action, float, float]]
                       ) -> list[tuple[float, float]]:
    """`memory_timeline` where the rank's chunks differ: a forward adds its own chunk's bytes
    as it starts, a backward frees them as it ends."""
    held = held_after([action for action, _, _ in timed], chunks)
    points, before = [(0.0, states)], 0.0
    for (action, start, end), after in zip(timed, held):
        peak = after if action.kind == "F" else before
        points += [(start, states + peak + work), (end, states + after)]
        before = after
    return points


def _level_timeline(states: float, work: float, levels: Sequence[tuple[float, float]],
                    timed: Sequence[tuple[Action, float, float]]
                    ) -> list[tuple[float, float]]:
    """`memory_timeline` from each action's (during, after) activations
    (`sim.models.activation_memory.paired_levels`): the level during it, with the working
    buffers, from its start; the level after it from its end."""
    points = [(0.0, states)]
    for (_, start, end), (during, after) in zip(timed, levels):
        points += [(start, states + during + work), (end, states + after)]
    return points
