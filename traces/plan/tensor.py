"""Pass 2: tensor- and sequence-parallel collectives, on the compute stream.

Megatron-LM issues these inline, so they sit on the compute stream and the next kernel waits
for them. Its f and g operators, per kernel (docs/plan-ops.md):

    without SP   forward: all-reduce the partial sums after proj, fc2 and embed
                 backward: all-reduce the input gradient after qkv, fc1 and logits
    with SP      forward: all-gather the sequence before qkv, fc1 and logits;
                          reduce-scatter after proj, fc2 and embed
                 backward: all-gather the gradient before proj, fc2 and (after pos_embed) embed;
                           all-gather the input again before qkv, fc1 and logits;
                           reduce-scatter after qkv, fc1 and logits

With SP the column-parallel GEMMs (qkv, fc1, logits) keep only the sequence shard of their
input for backward, as Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication does with
sequence_parallel (megatron/core/tensor_parallel/layers.py): its backward all-gathers the
saved shard over the TP group again, for the weight gradient, and then reduce-scatters the input
gradient. So SP saves a 1/t shard instead of the full b·s·h input of each of these GEMMs, and
its backward moves one b·s·h all-gather more per GEMM than TP alone.

Each buffer is the b·s·h activation (nccl-tests' convention: the all-gather's output, the
reduce-scatter's input). The vocab-parallel cross-entropy adds two small all-reduces forward:
the max of each token's logits after `logits` (b·s fp32, `ce_max`) and the target logit and
sum of exponentials after `cross_entropy` (2·b·s fp32, `ce_sum`).
"""

from __future__ import annotations

from traces.layout import Axis
from traces.ops import Op, OpKind, Phase, Stream
from traces.plan.nodes import Node, Program, RankContext

# (kernel, phase is backward) -> collectives to put before and after it, without and with SP.
_AR, _AG, _RS = OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER
_PLAIN: dict[tuple[str, bool], tuple[tuple[OpKind, ...], tuple[OpKind, ...]]] = {
    ("proj", False): ((), (_AR,)), ("fc2", False): ((), (_AR,)), ("embed", False): ((), (_AR,)),
    ("qkv", True): ((), (_AR,)), ("fc1", True): ((), (_AR,)), ("logits", True): ((), (_AR,)),
}
_SEQUENCE: dict[tuple[str, bool], tuple[tuple[OpKind, ...], tuple[OpKind, ...]]] = {
    ("qkv", False): ((_AG,), ()), ("fc1", False): ((_AG,), ()), ("logits", False): ((_AG,), ()),
    ("proj", False): ((), (_RS,)), ("fc2", False): ((), (_RS,)), ("embed", False): ((), (_RS,)),
    ("proj", True): ((_AG,), ()), ("fc2", True): ((_AG,), ()), ("embed", True): ((_AG,), ()),
    ("qkv", True): ((_AG,), (_RS,)), ("fc1", True): ((_AG,), (_RS,)),
    ("logits", True): ((_AG,), (_RS,)),
}
FP32 = 4


def add_tensor_parallel(ctx: RankContext, program: Program) -> Program:
    """Insert the TP/SP collectives around the kernels that need them."""
    layout = ctx.layout
    if layout.tp == 1:
        return program
    b, s = layout.micro_batch, ctx.model.seq_len
    sizes = {"tp": ctx.model.activation_bytes(b), "ce_max": b * s * FP32,
             "ce_sum": 2 * b * s * FP32}
    group = layout.group(ctx.rank, Axis.TP)
    where = _placements(layout.sp)
    out: Program = []
    for nodes in program:
        step: list[Node] = []
        for node in nodes:
            found = where.get((node.op.name, node.op.phase))
            if found is None:
                step.append(node)
                continue
            before, after = found
            step += [_collective(ctx, node, k, name, group, sizes[name]) for k, name in before]
            step.append(node)
            step += [_collective(ctx, node, k, name, group, sizes[name]) for k, name in after]
        out.append(step)
    return out


Placement = tuple[tuple[tuple[OpKind, str], ...], tuple[tuple[OpKind, str], ...]]


def _placements(sp: bool) -> dict[tuple[str, Phase | None], Placement]:
    """(kernel, phase) -> the (kind, name) collectives before and after it."""
    table = _SEQUENCE if sp else _PLAIN
    out: dict[tuple[str, Phase | None], Placement] = {}
    for (name, backward), (before, after) in table.items():
        phases = (Phase.BWD,) if backward else (Phase.FWD, Phase.RECOMPUTE)
        for phase in phases:
            out[(name, phase)] = (tuple((k, "tp") for k in before),
                                  tuple((k, "tp") for k in after))
    # The vocab-parallel cross-entropy's reductions (the head is never recomputed).
    logits_before, logits_after = out.get(("logits", Phase.FWD), ((), ()))
    out[("logits", Phase.FWD)] = (logits_before, (*logits_after, (_AR, "ce_max")))
    out[("cross_entropy", Phase.FWD)] = ((), ((_AR, "ce_sum"),))
    return out


def _collective(ctx: RankContext, beside: Node, kind: OpKind, name: str, group: tuple[int, ...],
                size: float) -> Node:
    op = beside.op
    dtype = "fp32" if name.startswith("ce_") else ctx.model.dtype
    return Node(Op(kind=kind, stream=Stream.COMPUTE, name=name, group=group, size_bytes=size,
                   layer=op.layer, microbatch=op.microbatch, phase=op.phase, dtype=dtype),
                beside.unit)
