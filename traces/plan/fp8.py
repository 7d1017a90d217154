"""Pass 2b: what FP8 adds besides its kernels (`traces.fp8`): the amax reductions of delayed
scaling and the step's cast of the weights.

With `fp8_recipe = "delayed"` (Hopper), Transformer Engine all-reduces the amaxes that scale
the next iteration's casts over the amax reduction group — the TP, CP and DP ranks of one
pipeline stage (Megatron-Core's get_amax_reduction_group) — when each fp8_autocast region ends:
after every stage's forward and backward of a micro-batch, on the compute stream (the next kernel
waits). Each carries 4 bytes per amax: 3 per FP8 GEMM forward, 2 backward. MXFP8 (Blackwell)
computes each block's scale from its own values: no reduction. Either recipe casts every FP8
GEMM weight once a step (`fp8_weight_cast`), after the optimizer updated them. (Under ZeRO-3
the weights are whole only while gathered, and TE casts them at each use; the plan still
counts one cast a step, a lower bound there.)
"""

from __future__ import annotations

from traces.fp8 import amax_bytes, weight_cast_bytes
from traces.ops import Op, OpKind, Phase, Stream
from traces.pipeline import Action
from traces.plan.nodes import Node, Program, RankContext
from traces.purpose import AmaxReduction, Kernel, KernelRun, ParamGather


def add_fp8(ctx: RankContext, actions: list[Action], program: Program) -> Program:
    """After each action's compute ops, its amax all-reduce (delayed scaling); after the
    optimizer (and ZeRO-1/2's parameter gathers), the weight cast. Runs after `add_optimizer`."""
    model, layout = ctx.model, ctx.layout
    if not model.fp8:
        return program
    group = amax_group(ctx)
    out: Program = []
    for nodes, action in zip(program[:-1], actions):
        layers = len(layout.layers_of_stage(model, action.stage))
        last = next((n for n in reversed(nodes) if n.op.kind is OpKind.COMPUTE), None)
        size = amax_bytes(model, layers, backward=last is not None and
                          last.op.phase is Phase.BWD)
        if last is None or not size or len(group) == 1:
            out.append(nodes)
            continue
        at = nodes.index(last) + 1
        op = Op(kind=OpKind.ALL_REDUCE, stream=Stream.COMPUTE, name="amax",
                purpose=AmaxReduction(), group=group, size_bytes=size,
                microbatch=last.op.microbatch, phase=last.op.phase, dtype="fp32")
        out.append([*nodes[:at], Node(op, None, [last]), *nodes[at:]])
    layers = sum(len(layout.layers_of_stage(model, stage))
                 for stage in layout.stages_of_rank(ctx.pp_rank))
    cast = Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=str(Kernel.FP8_WEIGHT_CAST),
              purpose=KernelRun(Kernel.FP8_WEIGHT_CAST), phase=Phase.OPT,
              mem_bytes=weight_cast_bytes(model, layers, layout.tp))
    gathers = [n for n in program[-1] if isinstance(n.op.purpose, ParamGather)]
    return [*out, [*program[-1], Node(cast, None, gathers)]]


def amax_group(ctx: RankContext) -> tuple[int, ...]:
    """The ranks of this rank's pipeline stage, its TP, CP and DP peers: with PP slowest in the
    rank order (`traces.layout`), the stage's block of world/pp consecutive ranks."""
    per_stage = ctx.layout.world // ctx.layout.pp
    first = ctx.pp_rank * per_stage
    return tuple(range(first, first + per_stage))
