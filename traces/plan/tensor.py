"""Pass 2: tensor- and sequence-parallel collectives, on the compute stream.

Megatron-LM issues these inline, so they sit on the compute stream and the layer waits for
them. Tensor parallelism all-reduces the partial sums of attention and of the MLP, forward and
backward; with sequence parallelism each becomes an all-gather of the sequence shards before
the block and a reduce-scatter after it. Every buffer is the b·s·h activation (nccl-tests'
convention: the all-gather's output, the reduce-scatter's input).
"""

from __future__ import annotations

from traces.ops import Op, OpKind, Stream
from traces.plan.nodes import Node, Program, RankContext

_BLOCKS = frozenset({"attn", "mlp"})


def add_tensor_parallel(ctx: RankContext, program: Program) -> Program:
    """Insert the TP/SP collectives around each attention and MLP op."""
    layout = ctx.layout
    if layout.tp == 1:
        return program
    group = layout.group(ctx.rank, "tp")
    size = ctx.model.activation_bytes(layout.micro_batch)
    after_kind = OpKind.REDUCE_SCATTER if layout.sp else OpKind.ALL_REDUCE
    out: Program = []
    for nodes in program:
        step: list[Node] = []
        for node in nodes:
            if node.op.name not in _BLOCKS:
                step.append(node)
                continue
            if layout.sp:
                step.append(_collective(ctx, node, OpKind.ALL_GATHER, group, size))
            step.append(node)
            step.append(_collective(ctx, node, after_kind, group, size))
        out.append(step)
    return out


def _collective(ctx: RankContext, beside: Node, kind: OpKind, group: tuple[int, ...],
                size: float) -> Node:
    op = beside.op
    return Node(Op(kind=kind, stream=Stream.COMPUTE, group=group, size_bytes=size,
                   layer=op.layer, microbatch=op.microbatch, phase=op.phase,
                   dtype=ctx.model.dtype), beside.unit)
