"""Stored activations of one GPU: per layer (Korthikanti et al. 2022, as `activation_terms`
generalizes it), per forward pass of a chunk, and how many passes a schedule keeps in flight.

Split from `sim.models.memory`, which adds them to the model states and working buffers.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.models.moe_memory import moe_activation_delta, rank_layers
from traces import cpu_offload
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe_overlap import DUALPIPE, pairs
from traces.pipeline import Action
from traces.stored_activations import activation_bytes_per_layer
from traces.zero_bubble import frees_at


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



def chunk_bytes(model: ModelSpec, layout: Layout, pp_rank: int) -> dict[int, float] | None:
    """Stored activations of one forward pass of each of the rank's chunks, where their layer
    counts differ (account_for_embedding / account_for_loss with vp > 1, a pipeline_layout);
    None where they are equal (`per_pass` then stands for every chunk)."""
    stages = layout.stages_of_rank(pp_rank)
    layers = {s: layout.layers_of_stage(model, s) for s in stages}
    if len({len(r) for r in layers.values()}) == 1:
        return None
    per_layer = activation_bytes_per_layer(model, layout)
    if not model.experts:
        return {s: len(r) * per_layer for s, r in layers.items()}
    return {s: sum(per_layer + moe_activation_delta(model, layout, i) for i in r)
            for s, r in layers.items()}


def held_after(actions: Sequence[Action], chunks: dict[int, float]) -> list[float]:
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


def per_pass(model: ModelSpec, layout: Layout, pp_rank: int) -> float:
    """Stored activations of one forward pass of a chunk of `pp_rank`: its layers' (an MoE
    model's, averaged over the rank's chunks)."""
    per_layer = activation_bytes_per_layer(model, layout)
    if not model.experts:
        offloaded = cpu_offload.freed_layers(layout)  # activations held in host memory
        return (layout.layers_per_chunk(model, pp_rank) - offloaded) * per_layer
    layers = rank_layers(model, layout, pp_rank)
    return sum(per_layer + moe_activation_delta(model, layout, layer)
               for layer in layers) / len(layout.stages_of_rank(pp_rank))  # vp; dualpipe 2


# --- Megatron-Core's combined 1F1B (overlap_moe_comm) -------------------------------------------

def layer_bytes(model: ModelSpec, layout: Layout, stage: int) -> list[float]:
    """Stored activations of each layer of `stage` for one micro-batch, in layer order."""
    per_layer = activation_bytes_per_layer(model, layout)
    return [per_layer + moe_activation_delta(model, layout, layer)
            for layer in layout.layers_of_stage(model, stage)]


def pair_rise(forward: Sequence[float], backward: Sequence[float]) -> float:
    """How far above what it held before a combined forward-backward step rises: Megatron-Core
    runs the forward's layer i beside the backward's layer n - 1 - i
    (NVIDIA/Megatron-LM megatron/core/models/common/model_chunk_schedule_plan.py,
    TransformerModelChunkSchedulePlan.run: "Phase 1: forward_layer[0] + backward_layer[3]
    ...", `b_schedule_plan.pop_layer()` and `b_layer.release_state()` after each), so the
    backward's layers are freed one by one as the forward's are stored: at step i the forward's
    first i + 1 layers are held (its layer i whole, counted before the backward's layer frees
    anything: an upper bound within the step) less the backward's last i; the remaining
    layers of the longer chunk run alone after the overlapped ones."""
    rise = held = 0.0
    for i in range(max(len(forward), len(backward))):
        held += forward[i] if i < len(forward) else 0.0
        rise = max(rise, held)
        held -= backward[-1 - i] if i < len(backward) else 0.0
    return rise


def combined_1f1b(layout: Layout) -> bool:
    """Whether Megatron-Core's combined 1F1B pairs the layout's actions (overlap_moe_comm
    under a Megatron schedule; DualPipe's pairs are its own, `traces.moe_overlap`)."""
    return layout.overlap_moe_comm and layout.schedule not in DUALPIPE


def paired_levels(model: ModelSpec, layout: Layout, pp_rank: int,
                  actions: Sequence[Action]) -> list[tuple[float, float]] | None:
    """(during, after) stored activations for each of the rank's actions where Megatron-Core's
    combined 1F1B pairs some of them (overlap_moe_comm, `traces.moe_overlap.pairs`, not
    DualPipe's pairs); None elsewhere. A forward alone adds its chunk, a backward frees it;
    a pair, in either order, rises by `pair_rise` over what it found held and leaves the
    forward's chunk in place of the backward's (both actions report the pair's top as
    their level during it)."""
    if not combined_1f1b(layout):
        return None
    first = dict(pairs(list(actions)))
    if not first:
        return None
    layers = {s: layer_bytes(model, layout, s) for s in layout.stages_of_rank(pp_rank)}
    frees = frees_at(actions)
    out: list[tuple[float, float]] = []
    held, i = 0.0, 0
    while i < len(actions):
        action = actions[i]
        if i in first:
            f, b = sorted((action, actions[first[i]]), key=lambda a: a.kind != "F")
            top = held + pair_rise(layers[f.stage], layers[b.stage])
            after = held + sum(layers[f.stage]) - sum(layers[b.stage])
            out += [(top, top), (top, after)]
            held, i = after, i + 2
            continue
        chunk = sum(layers[action.stage])
        change = chunk if action.kind == "F" else -chunk if action.kind == frees else 0.0
        before, held = held, held + change
        out.append((max(before, held), held))
        i += 1
    return out
