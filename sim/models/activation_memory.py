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
