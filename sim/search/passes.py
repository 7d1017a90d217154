"""The ops of one layer, of the embedding and of the output layer, as the plan builder makes them.

The analytic tier of `parasim search` must cost what the simulator runs, not a second idea of
it. So it asks the plan builder itself (`traces.plan.build`) for a *reduced* plan of the same
layout: the same tensor-parallel degree, micro-batch, SP, recomputation, ZeRO stage and
gradient precision, but one layer per pipeline stage, at most two stages and two data-parallel
replicas, and two micro-batches. Its ops are then sorted by what they belong to:

    layer    the ops of one transformer layer for one micro-batch (layer index set): kernels
             and TP/SP collectives on the compute stream, forward and (recompute +) backward;
             ZeRO-3's per-layer gathers and gradient reduce-scatters; SP's replicated gradients
    first    what only the first pipeline stage runs per micro-batch (embedding)
    last     what only the last stage runs per micro-batch (final norm, logits, cross-entropy)

plus what the step ends with: the kind of the gradient reduction (its `GradBucket`s),
whether ZeRO-1/2 gather the parameters after the optimizer, whether gradients are reduced in
every micro-batch (ZeRO-2) or once, the tied-embedding all-reduce, and the optimizer's HBM
bytes per parameter it owns. Sizes of collectives outside the layer (gradient buckets) depend
on the real layer count; `sim.search.analytic` takes only their kinds from here.

A reduced plan has ~100 ops per rank and is built once per `PassKey`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from traces.expert_grid import ep_group, etp_group, expert_data_degree, expert_data_group
from traces.kernel_groups import STEP_KERNELS
from traces.layout import Axis, Layout, Recompute, Schedule
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Phase, Stream
from traces.plan import build
from traces.plan.data import gradient_buckets as plan_gradient_buckets
from traces.plan.nodes import RankContext
from traces.purpose import (
    CpRing,
    EmbeddingGrads,
    ExpertParamGather,
    GradBucket,
    GradStat,
    KernelRun,
    ParamGather,
)

COMM_STREAMS = (Stream.ZERO_AG, Stream.ZERO_RS, Stream.DP)


@dataclass(frozen=True, slots=True)
class PassKey:
    """What the ops of a layer depend on (besides the model): the reduced plan's cache key."""

    tp: int
    sp: bool
    micro_batch: int
    recompute: Recompute
    zero: int
    """The ZeRO stage, 0 where there is no data parallelism (the plan adds nothing then)."""
    has_dp: bool
    fp32_main_grads: bool
    overlap_grad_reduce: bool
    tp_comm_overlap: bool
    overlap_param_gather: bool
    two_stages: bool
    """pp > 1: the embedding and the output layer sit on different ranks, and a tied
    embedding's gradients are all-reduced between them."""
    cp: int = 1
    cp_comm: str = "p2p"
    ep: int = 1
    etp: int = 1
    expert_dp: bool = False

    @staticmethod
    def of(layout: Layout) -> PassKey:
        return PassKey(tp=layout.tp, sp=layout.sp, micro_batch=layout.micro_batch,
                       recompute=layout.recompute,
                       zero=layout.zero if layout.data_degree > 1 else 0,
                       has_dp=layout.data_degree > 1, cp=layout.cp, cp_comm=str(layout.cp_comm),
                       ep=layout.ep, etp=layout.etp,
                       expert_dp=layout.ep * layout.etp > 1 and expert_data_degree(layout) > 1,
                       fp32_main_grads=layout.fp32_main_grads,
                       overlap_grad_reduce=layout.overlap_grad_reduce,
                       tp_comm_overlap=layout.tp_comm_overlap and layout.sp,
                       overlap_param_gather=layout.overlap_param_gather,
                       two_stages=layout.pp > 1)


Placed = tuple[Op, str]
"""An op and the axis of the real layout it runs over: "" (compute), "tp", "dp" or
"embedding" (the first and the last pipeline stage)."""


@dataclass(frozen=True, slots=True)
class UnitOps:
    """One unit's ops for one micro-batch: `compute_*` run in order on the compute stream
    (kernels and inline TP/SP collectives, and with tp_comm_overlap each overlapped region's
    GEMM and collective chunks, in plan order), `side_*` on the data-parallel streams."""

    compute_fwd: tuple[Placed, ...]
    compute_bwd: tuple[Placed, ...]
    """Backward kernels, with the recomputed forward where the layout recomputes."""
    side_fwd: tuple[Placed, ...]
    side_bwd: tuple[Placed, ...]
    final: tuple[Placed, ...]
    """What its backward leaves on the data-parallel streams in the step's last micro-batch
    (ZeRO-3's reduce-scatter, SP's replicated gradients; not the buckets): exposed when the
    unit is the last of its rank."""


@dataclass(frozen=True, slots=True)
class PassOps:
    """A layout's ops by what they belong to, from its reduced plan (module docstring)."""

    layer: UnitOps
    first: UnitOps
    """The embedding's ops (on the first stage)."""
    last: UnitOps
    """The output layer's ops (on the last stage)."""
    send_bytes: float
    """Bytes of one pipeline send (activations forward, their gradients backward)."""
    after_receive: tuple[Placed, ...]
    """What the compute stream runs on each pipeline receive before the first kernel (without
    SP under TP: the all-gather of the TP ranks' chunks)."""
    grad_reduction: OpKind | None
    """How bucketed gradients are reduced over DP: all-reduce (ZeRO 0), reduce-scatter
    (ZeRO 1/2), None (ZeRO-3 reduces per layer; no DP)."""
    reduce_every_microbatch: bool
    gather_after_optimizer: bool
    embedding_grads: float | None
    """Bytes of the tied embedding's gradient all-reduce between the first and the last
    stage (None: untied, or one stage holds both)."""
    step_kernels: tuple[tuple[str, float], ...]
    """The end of the step's kernels in order (fp16's unscale, the norm, the clip, the
    optimizer), each with the HBM bytes it moves per parameter the rank updates."""
    step_stats: tuple[float, ...]
    """Bytes of each gradient statistic's all-reduce (over `grad_stats_group`)."""
    expert_gather: float = 0.0
    """Bytes of one MoE layer's all-gather of its updated experts over the expert-DP group
    after the step (ZeRO 1/2 over two or more; 0: none, or beside the next forward)."""
    cp_ring: tuple[tuple[Phase, float], ...] = ()
    """Context parallelism's p2p ring: (phase, bytes) of one layer's sends in one
    micro-batch, forward and backward (none without CP or with the all-gather)."""


def reduced_layout(layout: Layout) -> Layout:
    """The layout of the reduced plan: at most two stages of one layer, two replicas, two
    micro-batches (the second is the last, where ZeRO 0/1 reduce their buckets)."""
    pp, dp = min(layout.pp, 2), min(layout.dp, 2)
    if layout.ep * layout.etp > 1:  # the expert grid still folds over tp·cp·dp, with an
        # expert-DP group of 2 where the layout has one
        need = layout.ep * layout.etp * (2 if expert_data_degree(layout) > 1 else 1)
        dp = max(dp, need // math.gcd(need, layout.tp * layout.cp))
    # one layer a stage: the keys that place layers on stages back at their even default;
    # the EP all-to-alls inline (overlap_moe_comm's pairs need interleaving at pp > 1): the
    # screen costs them exposed, an upper bound the full simulation then lowers; no offload
    # copies (the full simulation times them)
    return dataclasses.replace(layout, pp=pp, dp=dp, vp=1, schedule=Schedule.ONE_F_ONE_B,
                               global_batch=2 * layout.micro_batch * dp,
                               account_for_embedding=False, account_for_loss=False,
                               pipeline_layout="", overlap_moe_comm=False,
                               cpu_offloading_num_layers=0)


def pass_ops(model: ModelSpec, layout: Layout) -> PassOps:
    """Build the reduced plan of `layout` and sort its ops (see the module docstring)."""
    small = reduced_layout(layout)
    # one layer a stage; an MoE model's is an MoE layer (they are most of its layers)
    reduced_model = dataclasses.replace(model, layers=small.pp, dense_layers=0)
    ranks = [small.rank(pp=p) for p in range(small.pp)]
    plan = build(reduced_model, small, ranks=ranks)
    receiving = _after_receive(plan.ops[ranks[-1]])
    first_ops = _without(plan.ops[ranks[0]], _after_receive(plan.ops[ranks[0]]))
    last_ops = _without(plan.ops[ranks[-1]], receiving)
    layer = _unit(small, ranks[-1], last_ops, lambda op: op.layer is not None)
    if small.pp > 1:
        first = _unit(small, ranks[0], first_ops, _outside_layers)
        last = _unit(small, ranks[-1], last_ops, _outside_layers)
    else:
        embedding, head = _ends_by_position(first_ops)
        first = _unit(small, ranks[0], embedding, _outside_layers)
        last = _unit(small, ranks[0], head, _outside_layers)
    sends = [op.size_bytes for op in first_ops if op.kind is OpKind.SEND]
    grads = [op for op in first_ops if isinstance(op.purpose, GradBucket)]
    step_end = [op for op in first_ops if isinstance(op.purpose, KernelRun)
                and op.purpose.kernel in STEP_KERNELS]
    params = reduced_model.params_on_stages(small.stages_of_rank(0), small.num_stages,
                                           small.tp) / (small.data_degree if small.zero >= 1
                                                        else 1)
    return PassOps(
        layer=layer, first=first, last=last,
        send_bytes=sends[0] if sends else 0.0,
        after_receive=tuple((op, _axis(small, ranks[-1], op)) for op in receiving
                            if op.microbatch == 0 and op.phase is Phase.FWD),
        grad_reduction=grads[0].kind if grads else None,
        reduce_every_microbatch=len({op.microbatch for op in grads}) > 1,
        # overlap_param_gather: beside the next forward (what of it is exposed is left out)
        gather_after_optimizer=not layout.overlap_param_gather and any(
            isinstance(op.purpose, ParamGather) for op in first_ops),
        embedding_grads=next((op.size_bytes for op in first_ops
                              if isinstance(op.purpose, EmbeddingGrads)), None),
        step_kernels=tuple((str(op.purpose.kernel), op.mem_bytes / params)  # type: ignore
                           for op in step_end),
        step_stats=tuple(op.size_bytes for op in first_ops if isinstance(op.purpose, GradStat)),
        expert_gather=0.0 if layout.overlap_param_gather else next(
            (op.size_bytes for op in first_ops if isinstance(op.purpose, ExpertParamGather)),
            0.0),
        cp_ring=tuple((op.phase, op.size_bytes) for op in last_ops  # type: ignore[misc]
                      if isinstance(op.purpose, CpRing) and op.kind is OpKind.SEND
                      and op.microbatch == 0 and op.layer == last_ops_layer(last_ops)),
    )


def last_ops_layer(ops: Sequence[Op]) -> int | None:
    """The first layer index among `ops` (the reduced plan's layer on that rank)."""
    return next((op.layer for op in ops if op.layer is not None), None)


def grad_bytes(model: ModelSpec, layout: Layout) -> int:
    """Bytes per gradient element, as the plan builder has them."""
    return RankContext(model=model, layout=layout, rank=0).grad_bytes


def gradient_buckets(model: ModelSpec, layout: Layout, pp_rank: int) -> list[float]:
    """Bytes of each gradient bucket pipeline rank `pp_rank` reduces in a backward, in order,
    by the plan builder's own rule (`traces.plan.data.gradient_buckets`)."""
    ctx = RankContext(model=model, layout=layout, rank=layout.rank(pp=pp_rank))
    return [float(sum(ctx.unit_params(unit) * ctx.grad_bytes for unit in bucket))
            for bucket in plan_gradient_buckets(ctx)]


def _after_receive(ops: Sequence[Op]) -> list[Op]:
    """Compute-stream ops that wait for a pipeline receive (not kernels: collectives)."""
    received = {i for i, op in enumerate(ops) if op.kind is OpKind.RECV}
    return [op for op in ops if op.inline and received.intersection(op.deps)]


def _without(ops: Sequence[Op], drop: list[Op]) -> list[Op]:
    gone = {id(op) for op in drop}
    return [op for op in ops if id(op) not in gone]


def _outside_layers(op: Op) -> bool:
    """Per-micro-batch ops of the embedding or the output layer (not the step's end)."""
    return op.layer is None and op.microbatch is not None and \
        not isinstance(op.purpose, GradBucket | ParamGather)


def _unit(small: Layout, rank: int, ops: Sequence[Op],
          belongs: Callable[[Op], bool]) -> UnitOps:
    """The ops `belongs` picks, of the first micro-batch, split by stream and direction,
    each with its axis; and its side-stream ops after the last micro-batch's backward."""
    mine = [op for op in ops if belongs(op) and not op.kind.is_p2p]
    first = [op for op in mine if op.microbatch == 0]
    compute = [(op, _axis(small, rank, op)) for op in first
               if op.stream in (Stream.COMPUTE, Stream.TP_COMM)]
    side = [(op, _axis(small, rank, op)) for op in first if op.stream in COMM_STREAMS]
    assert len(compute) + len(side) == len(first), "an op on an unexpected stream"
    final = [(op, _axis(small, rank, op)) for op in mine
             if op.microbatch == small.num_microbatches - 1 and op.phase is not Phase.FWD
             and op.stream in COMM_STREAMS and op.stream != Stream.ZERO_AG]
    return UnitOps(compute_fwd=tuple(p for p in compute if p[0].phase is Phase.FWD),
                   compute_bwd=tuple(p for p in compute if p[0].phase is not Phase.FWD),
                   side_fwd=tuple(p for p in side if p[0].phase is Phase.FWD),
                   side_bwd=tuple(p for p in side if p[0].phase is not Phase.FWD),
                   final=tuple(final))


def _ends_by_position(ops: Sequence[Op]) -> tuple[list[Op], list[Op]]:
    """One stage holding both ends: its ops outside the layer, split into the embedding's and
    the output layer's by where they run. A forward runs the embedding before the layers and
    the output layer after them; a backward the other way round."""
    embedding: list[Op] = []
    head: list[Op] = []
    for mb in sorted({op.microbatch for op in ops if op.microbatch is not None}):
        for forward in (True, False):
            run = [op for op in ops if op.microbatch == mb and (op.phase is Phase.FWD) == forward]
            at = [i for i, op in enumerate(run) if op.layer is not None]
            before, after = run[:at[0]], run[at[-1] + 1:]
            embedding += before if forward else after
            head += after if forward else before
    return embedding, head


def _axis(small: Layout, rank: int, op: Op) -> str:
    """The axis of the reduced layout a collective of `rank` runs over; "" for compute."""
    if op.kind is OpKind.COMPUTE:
        return ""
    for axis in (Axis.TP, Axis.CP, Axis.DP):
        if op.group == small.group(rank, axis):
            return axis
    if op.group == small.data_group(rank):  # gradients and ZeRO over DP x CP
        return "dp"
    for name, group in (("ep", ep_group), ("etp", etp_group), ("edp", expert_data_group)):
        if op.group == group(small, rank):  # MoE's all-to-alls, ETP, expert gradients
            return name
    assert op.group == small.embedding_group(rank), f"{op.name} on {op.group}"
    return "embedding"
