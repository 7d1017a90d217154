"""Pass 5: the end of the step — tied-embedding gradients, clipping, the optimizer, ZeRO's
all-gather.

With tied embeddings and pp > 1 the first and the last pipeline rank each hold the word
embeddings and all-reduce their gradients (Megatron-LM). The end of the step waits for every
gradient reduction and for the last pipeline send, then runs in this order on the compute
stream, as Megatron-LM's optimizer step does (megatron/optimizer/optimizer.py, clip_grads.py:
the statistics' all-reduces are blocking calls between the kernels):

    grad_unscale        fp16 only: unscale the main gradients, check them for inf/NaN
    found_inf           fp16 only: all-reduce (max) of that check   GradStat(FOUND_INF)
    grad_norm           the sum of squares of the rank's gradients
    grad_norm (reduce)  all-reduce (sum) of it                        GradStat(NORM)
    grad_clip           scale the gradients by min(1, clip / norm)
    optimizer           Adam, parameters back to 16 bits, zeroed gradients

each kernel moving `traces.kernels.step_kernel_bytes` per parameter it owns (1/dp of them
under ZeRO). The two statistics are one fp32 number each, all-reduced over
`grad_stats_group`: the ranks that hold distinct gradients (the model-parallel ranks, and the
DP ranks too where ZeRO shards the gradients). ZeRO-1/2 then all-gather the updated
parameters, in the same slices the gradients were reduce-scattered in: the data pass's
`GradBucket`s of the last micro-batch, each gathered as a `ParamGather` of its index, and each
MoE layer's routed experts over the expert-DP group (`ExpertParamGather`, the slices its
`ExpertGrads` reduce-scatter left each rank); with overlap_param_gather, at the start of the
step instead, beside the forward (`traces.plan.param_gather`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter, indexOf

from traces.expert_grid import expert_grad_degree, expert_grad_group
from traces.fp8_params import expert_param_bytes, param_gather_bytes
from traces.kernels import step_kernel_bytes
from traces.layout import Layout
from traces.moe_spec import is_moe_layer
from traces.ops import Op, OpKind, Phase, Stream
from traces.pipeline import Action
from traces.plan.data import chunk_units, gradient_buckets
from traces.plan.experts import fsdp_experts
from traces.plan.nodes import Node, Program, RankContext
from traces.plan.param_gather import aligned_before_forward, gathers_before_forward
from traces.purpose import (
    EMBED,
    EmbeddingGrads,
    ExpertParamGather,
    GradBucket,
    GradStat,
    Kernel,
    KernelRun,
    ParamGather,
    StepStat,
    Unit,
)

STAT_BYTES = 4.0
"""One fp32 number per statistic."""


def add_optimizer(ctx: RankContext, program: Program,
                  schedule: Sequence[Action] = ()) -> Program:
    """Fill the end of the step (the program's last list, which may already hold gradient
    reductions): the tied-embedding all-reduce, the optimizer step and ZeRO-1/2's gathers."""
    model, layout = ctx.model, ctx.layout
    actions, nodes = program[:-1], list(chain.from_iterable(program))
    out: list[Node] = []
    # tied, or MTP's copy (finalize_model_grads all-reduces both over the embedding group)
    apart = layout.num_stages - 1 not in layout.stages_of_rank(layout.stage_rank(0))  # not
    # zbv's V, nor DualPipe's pair (DeepSeek-V3 report 2.2: shared on one PP rank)
    if apart and (model.tied_embeddings or model.mtp_layers) and _owns_embeddings(ctx):
        size = model.vocab * model.hidden / layout.tp * ctx.grad_bytes
        op = Op(kind=OpKind.ALL_REDUCE, stream=Stream.DP, name="embedding_grads",
                purpose=EmbeddingGrads(), group=layout.embedding_group(ctx.rank),
                size_bytes=size, phase=Phase.BWD, dtype=ctx.grad_dtype)
        last = _last(nodes, Stream.COMPUTE)
        assert last is not None, "a rank owning the embeddings runs their kernels"
        out.append(Node(op, EMBED, [last]))
    # (ZeRO-3's reduce-scatters are the only ops on zero_rs: elsewhere none to look for)
    scatters = _last(nodes, Stream.ZERO_RS) if layout.zero == 3 else None
    waits = [n for n in (_last(out, Stream.DP) or _last(nodes, Stream.DP), scatters) if n]
    waits += [n for n in (actions[-1] if actions else []) if n.op.kind is OpKind.SEND]
    shard = layout.data_degree if layout.zero >= 1 else 1
    layers = [layer for stage in layout.stages_of_rank(ctx.pp_rank)
              for layer in layout.layers_of_stage(model, stage)]
    params = model.params_on_stages(layout.stages_of_rank(ctx.pp_rank), layout.num_stages,
                                     layout.tp, layout.layers_of_rank(model, ctx.pp_rank),
                                     layers=layers, ep=layout.ep, etp=layout.etp)
    if model.experts:  # the routed experts' states shard over the expert-DP group
        experts = sum(ctx.expert_params(layer) for layer in layers)
        expert_shard = expert_grad_degree(layout) if layout.zero >= 1 else 1
        params = (params - experts) + experts * shard / expert_shard
    group = grad_stats_group(layout, ctx.rank)
    after = waits
    for kernel, per_param in step_kernel_bytes(model.data_dtype, ctx.grad_bytes,
                                               layout.optimizer):
        step = Node(Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=str(kernel),
                       purpose=KernelRun(kernel), phase=Phase.OPT,
                       mem_bytes=params / shard * per_param), None, after)
        out.append(step)
        stat = _STAT_AFTER.get(kernel)
        if stat is not None and len(group) > 1:
            step = Node(Op(kind=OpKind.ALL_REDUCE, stream=Stream.COMPUTE, name=str(stat),
                           purpose=GradStat(stat), group=group, size_bytes=STAT_BYTES,
                           phase=Phase.OPT, dtype="fp32"), None, [step])
            out.append(step)
        after = [step]
    gathers: list[tuple[Op, list[Unit]]] = []
    if layout.zero in (1, 2) and layout.data_degree > 1:
        # the same elements, as parameters (FP8 ones with fp8_param_gather)
        to_params = param_gather_bytes(model, layout, ctx.pp_rank) / ctx.grad_bytes
        units = gradient_buckets(ctx)
        dp_group = layout.data_group(ctx.rank)  # (asked once: a group of 64 costs ~0.7 ms)
        for bucket, size in _last_buckets(ctx, nodes):
            op = Op(kind=OpKind.ALL_GATHER, stream=Stream.DP, name="params",
                    purpose=ParamGather(bucket.index), group=dp_group,
                    size_bytes=size * to_params, phase=Phase.OPT, dtype=model.data_dtype)
            gathers.append((op, units[bucket.index]))
    gathers += _expert_gathers(ctx, layers)
    if layout.overlap_param_gather and gathers:  # the last step's, beside this forward
        program = [*actions, program[-1] + out]
        if layout.vp == 1:
            return gathers_before_forward(program, gathers)
        return aligned_before_forward(program, gathers, [_chunk(ctx, u) for _, u in gathers],
                                      _chunk_dispatch(ctx, schedule))
    out += [Node(op, None, [step]) for op, _ in gathers]
    return [*actions, program[-1] + out]


def _chunk(ctx: RankContext, units: list[Unit]) -> int:
    """The model chunk (of the rank's virtual stages) holding a bucket's `units`."""
    layout = ctx.layout
    stages = layout.stages_of_rank(ctx.pp_rank)
    for chunk, stage in enumerate(stages):
        if units[0] in chunk_units(ctx, stage):
            return chunk
    raise AssertionError(f"no chunk of rank {ctx.rank} holds {units[0]}")


def _chunk_dispatch(ctx: RankContext, schedule: Sequence[Action]) -> dict[int, int]:
    """Megatron-Core's aligned param gathers (`traces.plan.param_gather`): chunk c >= 2 is
    dispatched before the rank's forward of virtual micro-batch (c - 1)·pp - r; the index of
    that action in `schedule`, for each chunk whose forward comes."""
    layout, r = ctx.layout, ctx.pp_rank
    forwards = [a for a, action in enumerate(schedule) if action.kind == "F"]
    out = {}
    for chunk in range(2, layout.vp):
        k = (chunk - 1) * layout.pp - r
        if 0 <= k < len(forwards):
            out[chunk] = forwards[k]
    return out


def _expert_gathers(ctx: RankContext, layers: list[int]) -> list[tuple[Op, list[Unit]]]:
    """ZeRO >= 1 over an expert-DP group of two or more (but FSDP's, which gathers before use):
    each MoE layer's updated routed experts, all-gathered as parameters (the elements its
    `ExpertGrads` reduce-scattered)."""
    model, layout = ctx.model, ctx.layout
    group = expert_grad_group(layout, ctx.rank) if model.experts else ()
    if layout.zero == 0 or fsdp_experts(layout) or len(group) < 2:
        return []  # (ZeRO 3 with DP 1: sharded over expert-DP as ZeRO 1/2 shard them)
    out = []
    for layer in layers:
        if is_moe_layer(model, layer):
            op = Op(kind=OpKind.ALL_GATHER, stream=Stream.DP, name="expert_params",
                    purpose=ExpertParamGather(Unit.of_layer(layer)), group=group,
                    size_bytes=ctx.expert_params(layer) * expert_param_bytes(model, layout),
                    layer=layer,
                    phase=Phase.OPT, dtype=model.data_dtype)
            out.append((op, [Unit.of_layer(layer)]))
    return out


_STAT_AFTER = {Kernel.GRAD_UNSCALE: StepStat.FOUND_INF, Kernel.GRAD_NORM: StepStat.NORM}


def grad_stats_group(layout: Layout, rank: int) -> tuple[int, ...]:
    """The ranks whose gradients together make the step's: those of `rank`'s model replica
    (its TP and PP ranks, Megatron's model-parallel group), or every rank where ZeRO shards
    the gradients over DP (x CP) (the distributed optimizer's norm covers every shard) or
    where EP > 1 spreads the routed experts over ranks outside the replica (Megatron-Core's
    expert optimizer reduces its norm over the expert model-parallel ranks; one all-reduce
    over every rank sums the same squares, each counted once)."""
    c = layout.coords(rank)
    if (layout.zero >= 1 and layout.data_degree > 1) or layout.ep > 1:
        return tuple(range(layout.world))
    return tuple(sorted(layout.rank(tp=t, cp=c.cp, dp=c.dp, pp=p)
                        for t in range(layout.tp) for p in range(layout.pp)))


def _owns_embeddings(ctx: RankContext) -> bool:
    stages = ctx.layout.stages_of_rank(ctx.pp_rank)
    return 0 in stages or ctx.last_stage in stages


def _last(nodes: list[Node], stream: Stream) -> Node | None:
    """The last node on `stream` (the one every earlier node on it has finished before),
    searched at C speed (a plan has ~10^6 nodes, and no ZeRO-3 op but at ZeRO 3)."""
    try:
        return nodes[len(nodes) - 1 - indexOf(map(_STREAM, reversed(nodes)), stream)]
    except ValueError:
        return None


_STREAM = attrgetter("op.stream")


def _last_buckets(ctx: RankContext, nodes: list[Node]) -> list[tuple[GradBucket, float]]:
    """The gradient buckets the data pass reduced in the last micro-batch's backward, with
    their sizes."""
    return [(n.op.purpose, n.op.size_bytes) for n in nodes
            if isinstance(n.op.purpose, GradBucket) and n.op.purpose.round == ctx.last_microbatch]
