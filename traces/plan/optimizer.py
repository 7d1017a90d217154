"""Pass 5: the end of the step — tied-embedding gradients, the optimizer, ZeRO's all-gather.

With tied embeddings and pp > 1 the first and the last pipeline rank each hold the word
embeddings and all-reduce their gradients (Megatron-LM). The optimizer step waits for every
gradient reduction and for the last pipeline send; it moves
`traces.kernels.optimizer_bytes_per_param` bytes (Megatron-LM's mixed-precision step: gradients
to fp32, unscale under fp16, the norm, Adam, parameters back to 16 bits, zeroed gradients) per
parameter it owns (1/dp of them under ZeRO). ZeRO-1/2 then all-gather the updated
parameters, in the same slices the gradients were reduce-scattered in: the data pass's
`GradBucket`s of the last micro-batch, each gathered as a `ParamGather` of its index.
"""

from __future__ import annotations

from traces.expert_grid import expert_data_degree
from traces.kernels import optimizer_bytes_per_param
from traces.ops import Op, OpKind, Phase, Stream
from traces.plan.nodes import Node, Program, RankContext
from traces.purpose import EMBED, EmbeddingGrads, GradBucket, Kernel, KernelRun, ParamGather


def add_optimizer(ctx: RankContext, program: Program) -> Program:
    """Fill the end of the step (the program's last list, which may already hold gradient
    reductions): the tied-embedding all-reduce, the optimizer step and ZeRO-1/2's gathers."""
    model, layout = ctx.model, ctx.layout
    actions, nodes = program[:-1], [node for step in program for node in step]
    out: list[Node] = []
    if layout.pp > 1 and model.tied_embeddings and _owns_embeddings(ctx):
        size = model.vocab * model.hidden / layout.tp * ctx.grad_bytes
        op = Op(kind=OpKind.ALL_REDUCE, stream=Stream.DP, name="embedding_grads",
                purpose=EmbeddingGrads(), group=layout.embedding_group(ctx.rank),
                size_bytes=size, phase=Phase.BWD, dtype=ctx.grad_dtype)
        last = _last(nodes, Stream.COMPUTE)
        assert last is not None, "a rank owning the embeddings runs their kernels"
        out.append(Node(op, EMBED, [last]))
    waits = [n for n in (_last(nodes + out, Stream.DP), _last(nodes, Stream.ZERO_RS)) if n]
    waits += [n for n in (actions[-1] if actions else []) if n.op.kind is OpKind.SEND]
    shard = layout.data_degree if layout.zero >= 1 else 1
    layers = [layer for stage in layout.stages_of_rank(ctx.pp_rank)
              for layer in layout.layers_of_stage(model, stage)]
    params = model.params_on_stages(layout.stages_of_rank(ctx.pp_rank), layout.num_stages,
                                     layout.tp, layout.layers_of_rank(model, ctx.pp_rank),
                                     layers=layers, ep=layout.ep, etp=layout.etp)
    if model.experts:  # the routed experts' states shard over the expert-DP group
        experts = sum(ctx.expert_params(layer) for layer in layers)
        expert_shard = expert_data_degree(layout) if layout.zero >= 1 else 1
        params = (params - experts) + experts * shard / expert_shard
    per_param = optimizer_bytes_per_param(model.data_dtype, ctx.grad_bytes)
    step = Node(Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name="optimizer",
                   purpose=KernelRun(Kernel.OPTIMIZER), phase=Phase.OPT,
                   mem_bytes=params / shard * per_param), None, waits)
    out.append(step)
    if layout.zero in (1, 2) and layout.data_degree > 1:
        to_params = model.dtype_bytes / ctx.grad_bytes  # the same elements, as parameters
        for bucket, size in _last_buckets(ctx, nodes):
            op = Op(kind=OpKind.ALL_GATHER, stream=Stream.DP, name="params",
                    purpose=ParamGather(bucket.index), group=layout.data_group(ctx.rank),
                    size_bytes=size * to_params, phase=Phase.OPT, dtype=model.data_dtype)
            out.append(Node(op, None, [step]))
    return [*actions, program[-1] + out]


def _owns_embeddings(ctx: RankContext) -> bool:
    stages = ctx.layout.stages_of_rank(ctx.pp_rank)
    return 0 in stages or ctx.last_stage in stages


def _last(nodes: list[Node], stream: Stream) -> Node | None:
    """The last node on `stream` (the one every earlier node on it has finished before)."""
    return next((n for n in reversed(nodes) if n.op.stream == stream), None)


def _last_buckets(ctx: RankContext, nodes: list[Node]) -> list[tuple[GradBucket, float]]:
    """The gradient buckets the data pass reduced in the last micro-batch's backward, with
    their sizes."""
    return [(n.op.purpose, n.op.size_bytes) for n in nodes
            if isinstance(n.op.purpose, GradBucket) and n.op.purpose.round == ctx.last_microbatch]
