"""Pass 1: schedule actions to compute ops.

Each action `sFm` / `sBm` of the rank's schedule becomes the compute ops of virtual stage s for
micro-batch m, in the order a GPU runs them: forward — the embedding on the first stage, each
layer, the output layer on the last; backward — the output layer, then each layer in reverse
(its recomputation, if any, right before its backward), then the embedding. Nothing else: the
later passes add communication around these ops.
"""

from __future__ import annotations

from traces.layout import Recompute
from traces.ops import Op, OpKind, Phase, Stream
from traces.pipeline import Action
from traces.plan.nodes import Node, Program, RankContext, Unit


def lower_compute(ctx: RankContext, actions: list[Action]) -> Program:
    """The compute ops of every action, tagged with their unit; an empty end of the step."""
    costs = {phase: _block_costs(ctx, phase) for phase in (Phase.FWD, Phase.RECOMPUTE,
                                                             Phase.BWD)}
    program = [(_forward if a.kind == "F" else _backward)(ctx, a, costs) for a in actions]
    return [*program, []]


def _forward(ctx: RankContext, action: Action,
             costs: dict[Phase, list[tuple[str, float, float]]]) -> list[Node]:
    m, b, t, mb = ctx.model, ctx.layout.micro_batch, ctx.layout.tp, action.microbatch
    nodes = []
    if action.stage == 0:
        nodes.append(_node("embed", "embed", Phase.FWD, 0.0, m.embed_bytes(b), mb))
    for layer in ctx.layout.layers_of_stage(m, action.stage):
        nodes += _block(layer, mb, Phase.FWD, costs)
    if action.stage == ctx.last_stage:
        nodes.append(_node("head", "head", Phase.FWD, m.head_flops(b, t),
                           m.head_bytes(b, t), mb))
    return nodes


def _backward(ctx: RankContext, action: Action,
              costs: dict[Phase, list[tuple[str, float, float]]]) -> list[Node]:
    m, b, t, mb = ctx.model, ctx.layout.micro_batch, ctx.layout.tp, action.microbatch
    nodes = []
    if action.stage == ctx.last_stage:
        nodes.append(_node("head", "head", Phase.BWD, 2 * m.head_flops(b, t),
                           2 * m.head_bytes(b, t), mb))
    for layer in reversed(ctx.layout.layers_of_stage(m, action.stage)):
        if ctx.layout.recompute is Recompute.FULL:
            nodes += _block(layer, mb, Phase.RECOMPUTE, costs)
        elif ctx.layout.recompute is Recompute.SELECTIVE:
            nodes.append(_node(layer, "attn_core", Phase.RECOMPUTE,
                               m.attn_core_flops(b, t), 0.0, mb, layer=layer))
        nodes += _block(layer, mb, Phase.BWD, costs)
    if action.stage == 0:
        nodes.append(_node("embed", "embed", Phase.BWD, 0.0, 2 * m.embed_bytes(b), mb))
    return nodes


def _block(layer: int, mb: int, phase: Phase,
           costs: dict[Phase, list[tuple[str, float, float]]]) -> list[Node]:
    return [_node(layer, name, phase, flops, mem, mb, layer=layer)
            for name, flops, mem in costs[phase]]


def _block_costs(ctx: RankContext, phase: Phase) -> list[tuple[str, float, float]]:
    """(name, FLOPs, bytes) of a layer's ops in the order the phase runs them: attention, MLP
    and the memory-bound rest (norms, dropouts, residuals) forward; the rest's gradients
    first, then MLP and attention backward, which moves and computes twice the forward."""
    m, b, t, layout = ctx.model, ctx.layout.micro_batch, ctx.layout.tp, ctx.layout
    flash = layout.flash_attention
    scale = 2.0 if phase is Phase.BWD else 1.0
    ops = [("attn", scale * m.attn_flops(b, t), scale * m.attn_bytes(b, t, flash)),
           ("mlp", scale * m.mlp_flops(b, t), scale * m.mlp_bytes(b, t))]
    norm = ("norm", 0.0, scale * m.norm_bytes(b, t, layout.sp, flash))
    return [norm, *ops[::-1]] if phase is Phase.BWD else [*ops, norm]


def _node(unit: Unit, name: str, phase: Phase, flops: float, mem_bytes: float,
          mb: int, layer: int | None = None) -> Node:
    op = Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=name, phase=phase, flops=flops,
            mem_bytes=mem_bytes, layer=layer, microbatch=mb)
    return Node(op, unit)
