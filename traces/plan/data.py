"""Pass 4: data parallelism — gradient buckets (DDP, ZeRO-1/2) and ZeRO-3's gathers.

When gradients are reduced over the DP group (DP x CP under context parallelism, as
Megatron-Core's data-parallel group with context parallelism; ZeRO shards over it too):
    ZeRO 0 and 1   once, in the last micro-batch's backward (gradient accumulation): units'
                   gradients fill 25 MiB buckets in backward order; a full bucket is reduced
                   (all-reduce for ZeRO 0, reduce-scatter for ZeRO 1) as soon as it is full,
                   the rest at the end of each model chunk's backward
    ZeRO 2         the same in every micro-batch's backward (gradients stay sharded)
    ZeRO 3         per unit and micro-batch, a reduce-scatter right after the unit's backward
With `grad_sync = "step"` (`traces.fsdp`) ZeRO 2 reduces its buckets as ZeRO 1 does, in the
last micro-batch only (Megatron-Core's distributed optimizer), and ZeRO 3 each unit in its
last micro-batch's backward (FSDP2 without gradient sync before it), its SP gradients too.
Without `overlap_grad_reduce` (Megatron-LM before 2023) the same buckets are reduced one after
another once the whole backward is over (ZeRO 0/1: of the step; ZeRO 2: of the micro-batch);
FSDP (ZeRO 3) always overlaps.

Against Megatron-Core's DDP (megatron/core/distributed/distributed_data_parallel.py) the timing
rule is the same — a bucket is reduced once the last of its gradients is complete, buckets in
backward order, in the last micro-batch only — and four things differ, kept so that shipped
predictions keep their numbers: its default bucket is max(40M, 1M x dp) parameters, not 25 MiB
of gradients (`bucket_bytes` sets either); it cuts buckets at parameters, not units; without
--overlap-grad-reduce it makes one bucket (one collective), where parasim reduces the same
buckets back to back (GPT-3 on 1024 A100s: 1.7 ms of a 26.6 s step); and it does not bucket
model chunks after the first (`disable_bucketing=(model_chunk_idx > 0)`), which the
interleaved schedule reduces whole.

ZeRO-3 (FSDP) also all-gathers each unit's parameters before its forward and its backward. With
experts (MoE Parallel Folding's FSDP+EP) an MoE layer's routed experts shard over their
expert-data-parallel group instead: gathered over it (`ExpertUnitGather`) beside the dense
gather over DP, their gradients reduce-scattered over it (`ExpertGrads`) beside the dense ones,
freed as the unit is. The
gather of layer l waits until layer l ∓ (ZERO3_PREFETCH + 1) has finished in the same phase,
so at most two layers are unsharded at once: one computing, one prefetched. A unit is gathered
before a pass whenever it is not gathered then, and freed after a pass as
`traces.fsdp.frees_after` says: after every pass by default (two gathers per micro-batch);
with `reshard_after_forward = false` only after the backward (one), and under a pipeline
only after the step's last backward (one per step).

With sequence parallelism, the parameters every TP rank holds in full (layer norms, the
row-parallel biases, positions) see only their rank's share of the sequence, so their
gradients are summed over the TP group (`sp_grads`, `sp_grads.embed`, `sp_grads.head`) before
the unit's gradients are reduced.

Where FSDP2 accumulates gradients across micro-batches (ZeRO 3 with `grad_sync = "step"`), each
unit's backward ends with its accumulation kernel (`grad_accum`), and under a pipeline the
step's reduce-scatters wait for the stage's whole last backward (`traces.fsdp_kernels`). Under
PyTorch's stack (FSDP2) each gather is followed by its copy-out (`fsdp_copy_out`) on the compute
stream before the unit's first op, and each reduce-scatter waits for its copy-in
(`fsdp_rs_copy_in`), on the compute stream after the unit's backward; Megatron-FSDP without
gradient_accumulation_fusion runs the same copy (its `main_grad.copy_`).

A unit's gradients are complete after the last op it runs on the compute stream; reductions
wait for that op, gathers are waited for by the unit's first op on the compute stream. Each op
states its purpose (`traces.purpose`): `UnitGather`, `UnitGradReduce` and `SpGrads` name their
unit, `GradBucket` its index and round (the micro-batch whose backward reduces it), which the
optimizer pass reads back to gather the same buckets. Their labels, as docs/plan-ops.md shows:
`params` / `grads` / `sp_grads` for layers (with `layer` set), `params.embed`, `grads.head`,
`sp_grads.embed` and so on outside them.
"""

from __future__ import annotations

from traces.expert_grid import expert_grad_group
from traces.fsdp import GradSync, frees_after, syncs_grads
from traces.fsdp_kernels import (
    accumulate_bytes,
    accumulates,
    copies_in,
    copies_out,
    copy_out_bytes,
    reduces_after_stage,
    rs_copy_in_bytes,
)
from traces.layout import Axis
from traces.ops import Op, OpKind, Phase, Stream
from traces.pipeline import Action
from traces.plan.nodes import Node, Program, RankContext
from traces.purpose import (
    EMBED,
    HEAD,
    ExpertGrads,
    ExpertUnitGather,
    GradBucket,
    Kernel,
    KernelRun,
    Part,
    Purpose,
    SpGrads,
    Unit,
    UnitGather,
    UnitGradReduce,
)
from traces.zero_bubble import splits_backward

ZERO3_PREFETCH = 1  # layers gathered ahead of the one computing (FSDP's forward prefetch)


def add_data_parallel(ctx: RankContext, actions: list[Action], program: Program) -> Program:
    """Insert ZeRO-3 gathers and gradient reductions; `program[k]` holds `actions[k]`'s ops."""
    layout = ctx.layout
    partial = layout.sp or ctx.model.mla or ctx.model.qk_norm  # replicated, partial grads
    if layout.data_degree == 1 and not (layout.tp > 1 and partial):
        return program
    walk = _DataWalk(ctx)
    out = [walk.action(action, nodes) for action, nodes in zip(actions, program)]
    end = list(program[len(actions)])
    if walk.deferred:  # no overlap: every bucket once the step's backward is over
        last = next(n for step in reversed(out) for n in reversed(step) if n.on_compute)
        end += walk.flush_deferred(last)
    return [*out, end]


def chunk_units(ctx: RankContext, stage: int) -> list[Unit]:
    """The units of virtual stage `stage` in the order its backward completes them: the
    output layer (last stage), the layers in reverse, the embedding (first stage)."""
    layout, model = ctx.layout, ctx.model
    head = [HEAD] if stage == layout.num_stages - 1 else []
    embed = [EMBED] if stage == 0 else []
    layers = [Unit.of_layer(layer) for layer in reversed(layout.layers_of_stage(model, stage))]
    return [*head, *layers, *embed]


def gradient_buckets(ctx: RankContext) -> list[list[Unit]]:
    """The units of each gradient bucket the rank reduces in a backward, in order (its model
    chunks last first): units' gradients fill a bucket until it holds `bucket_bytes`, and a
    chunk's backward closes its last one. The one statement of the rule: the plan builder
    cuts by it, the executor lays out its buckets and the layout search costs them by it."""
    buckets: list[list[Unit]] = []
    for stage in reversed(ctx.layout.stages_of_rank(ctx.pp_rank)):
        current: list[Unit] = []
        filled = 0.0
        for unit in chunk_units(ctx, stage):
            current.append(unit)
            filled += ctx.unit_params(unit) * ctx.grad_bytes
            if filled >= ctx.layout.bucket_bytes:
                buckets.append(current)
                current, filled = [], 0.0
        if current:
            buckets.append(current)
    return buckets


def unit_label(kind: str, unit: Unit) -> str:
    """The display label of a unit's op: `params` / `grads` / `sp_grads` for a layer;
    `params.embed`, `grads.head`, `sp_grads.embed` ... outside the layers."""
    return kind if unit.part is Part.LAYER else f"{kind}.{unit.part}"


class _DataWalk:
    """The state a walk over one rank's actions carries: the bucket being filled, buckets
    waiting for the end of the backward, and where each layer's compute ended per (phase,
    layer, micro-batch) for ZeRO-3's prefetch limit."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self.dp_group = ctx.layout.data_group(ctx.rank)  # DP x CP
        self.tp_group = ctx.layout.group(ctx.rank, Axis.TP)
        self.zero = ctx.layout.zero if ctx.layout.data_degree > 1 else 0
        self.bucket: list[float] = []
        self.deferred: list[float] = []
        self.reduced: dict[int, int] = {}
        """Buckets reduced so far per round (micro-batch): the next one's index."""
        self.ends: dict[tuple[Phase, int, int], Node] = {}
        # Units after which a bucket is full; a chunk's last unit closes one anyway.
        self.closes = {bucket[-1] for bucket in gradient_buckets(ctx)}
        self.every_microbatch = self.zero >= 2 and ctx.layout.sync is GradSync.MICROBATCH
        """Buckets reduced in every micro-batch (ZeRO 2 by default; ZeRO 3 is per unit)."""
        self.grads_kind = "W" if splits_backward(ctx.layout.schedule) else "B"
        """The action after which a unit's gradients are complete (a split backward's W)."""
        self.gathered: set[Unit] = set()
        """ZeRO-3 units gathered now (`traces.fsdp.frees_after` frees them)."""
        self.accumulates = accumulates(ctx.layout, self.zero)
        """FSDP2 accumulates unsharded gradients across micro-batches (`traces.fsdp_kernels`)."""
        self.after_stage = reduces_after_stage(ctx.layout, self.zero)
        """The step's reduce-scatters wait for the stage's whole last backward (PipelineStage)."""
        self.copies_out = copies_out(self.zero, ctx.model.kernels)
        """FSDP2 copies each gathered unit out of its all-gather buffer (PyTorch's stack)."""
        self.copies_in = copies_in(self.zero, ctx.model.kernels,
                                   ctx.layout.gradient_accumulation_fusion)
        """Each reduce-scatter waits for its gradients' copy into its input (FSDP2's copy-in,
        Megatron-FSDP's main_grad copy without gradient accumulation fusion)."""
        self.accumulated: set[Unit] = set()
        """Units whose gradients this step has accumulated once already."""
        self.edp_group = expert_grad_group(ctx.layout, ctx.rank) \
            if self.zero == 3 and ctx.model.experts else ()
        """ZeRO 3 with EP: the group an MoE layer's routed experts shard over (expert-DP)."""

    def action(self, action: Action, group: list[Node]) -> list[Node]:
        zero, mb = self.zero, action.microbatch
        phase = Phase.FWD if action.kind == "F" else Phase.BWD
        final = self.ctx.ends_chunk(mb)
        if final and zero != 3:  # DualPipe's first copy ends at m/2 - 1: its buckets are
            mb = self.ctx.last_microbatch  # the step's last round all the same
        reduce_grads = action.kind == self.grads_kind and zero != 3 and \
            (final or self.every_microbatch)
        gathers = zero == 3 and self.ctx.layout.data_degree > 1
        if not (gathers or reduce_grads):
            return group  # gradients accumulate locally in this micro-batch
        on_compute = [node for node in group if node.on_compute]
        firsts, lasts = _unit_bounds(on_compute)
        out: list[Node] = []
        held: list[Node] = []  # reductions issued once the action is over (`after_stage`)
        for node in group:
            unit = node.unit
            if gathers and unit is not None and node in firsts and unit not in self.gathered:
                gathers_here = self._gathers(unit, mb, phase)
                out += gathers_here
                for gather in gathers_here:
                    node.wait_for(gather)
                for copy in self._copy_out(unit, mb, phase, gathers_here):
                    out.append(copy)
                    node.wait_for(copy)
                self.gathered.add(unit)
            out.append(node)
            if node.on_compute and node.op.layer is not None and node.op.phase is not None:
                self.ends[(node.op.phase, node.op.layer, mb)] = node
            if unit is not None and node in lasts:
                if frees_after(self.ctx.layout, action.kind == "F", mb):
                    self.gathered.discard(unit)
                if action.kind == self.grads_kind:
                    last = self._accumulate(unit, mb, node, out)
                    ready = self._grads_ready(unit, mb, last)
                    (held if self.after_stage else out).extend(ready)
        if held:  # after the whole backward, its last accumulation included
            end = next(node for node in reversed(out) if node.on_compute)
            for node in held:
                node.wait_for(end)
            out += held
        if reduce_grads:
            out += self._end_of_backward(mb, on_compute[-1])
        return out

    def _gathers(self, unit: Unit, mb: int, phase: Phase) -> list[Node]:
        """The unit's gather over DP; an MoE layer's experts' over expert-DP beside it."""
        dense = self._gather(unit, mb, phase)
        experts = self._expert_size(unit, self.ctx.model.dtype_bytes)
        if not experts:
            return [dense]
        op = self._collective(OpKind.ALL_GATHER, Stream.ZERO_AG, "expert_params",
                              ExpertUnitGather(unit), self.edp_group, experts, unit.layer, mb,
                              phase)
        return [dense, Node(op, unit, list(dense.after))]

    def _copy_out(self, unit: Unit, mb: int, phase: Phase, gathers: list[Node]) -> list[Node]:
        """FSDP2's copy-out of the unit's gathered bytes, on the compute stream once its
        gathers are done (`traces.fsdp_kernels`); none outside PyTorch's stack."""
        if not self.copies_out:
            return []
        size = copy_out_bytes(sum(gather.op.size_bytes for gather in gathers))
        op = Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=str(Kernel.FSDP_COPY_OUT),
                purpose=KernelRun(Kernel.FSDP_COPY_OUT), layer=unit.layer, microbatch=mb,
                phase=phase, mem_bytes=size)
        return [Node(op, unit, list(gathers))]

    def _expert_size(self, unit: Unit, per_param: float) -> float:
        """Bytes of the unit's routed experts ZeRO 3 shards over expert-DP (0: none)."""
        if len(self.edp_group) < 2 or unit.layer is None:
            return 0.0
        return self.ctx.expert_params(unit.layer) * per_param

    def _gather(self, unit: Unit, mb: int, phase: Phase) -> Node:
        waits: list[Node] = []
        layer = unit.layer
        if layer is not None:
            ahead = ZERO3_PREFETCH + 1
            done = self.ends.get((phase, layer + ahead if phase is Phase.BWD else layer - ahead,
                                  mb))
            waits = [done] if done is not None else []
        size = self.ctx.unit_params(unit) * self.ctx.model.dtype_bytes
        op = self._collective(OpKind.ALL_GATHER, Stream.ZERO_AG, unit_label("params", unit),
                              UnitGather(unit), self.dp_group, size, layer, mb, phase)
        return Node(op, unit, waits)

    def _accumulate(self, unit: Unit, mb: int, last: Node, out: list[Node]) -> Node:
        """FSDP2's accumulation kernel of `unit`'s gradients after its backward (appended to
        `out`, on the compute stream), which the reduction then waits for; `last` where there
        is none."""
        if not self.accumulates or self.ctx.layout.data_degree == 1:
            return last
        first = unit not in self.accumulated
        self.accumulated.add(unit)
        size = accumulate_bytes(self.ctx.unit_params(unit), self.ctx.model.dtype_bytes,
                                self.ctx.grad_bytes, first)
        if not size:
            return last
        op = Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=str(Kernel.GRAD_ACCUM),
                purpose=KernelRun(Kernel.GRAD_ACCUM), layer=unit.layer, microbatch=mb,
                phase=Phase.BWD, mem_bytes=size)
        node = Node(op, unit, [last])
        out.append(node)
        return node

    def _rs_copy_in(self, unit: Unit, mb: int, after: list[Node]) -> Node | None:
        """FSDP2's reduce-scatter copy-in of the unit's gradients (dense and routed experts'),
        or Megatron-FSDP's main_grad copy, on the compute stream after `after`
        (`traces.fsdp_kernels`); None where neither runs. Accumulated gradients are read in the
        reduce dtype, others in the model's."""
        if not self.copies_in:
            return None
        held = self.ctx.grad_bytes if self.accumulates else self.ctx.model.dtype_bytes
        params = self.ctx.unit_params(unit) + self._expert_size(unit, 1.0)
        op = Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=str(Kernel.FSDP_RS_COPY_IN),
                purpose=KernelRun(Kernel.FSDP_RS_COPY_IN), layer=unit.layer, microbatch=mb,
                phase=Phase.BWD,
                mem_bytes=rs_copy_in_bytes(params, held, self.ctx.grad_bytes))
        return Node(op, unit, after)

    def _grads_ready(self, unit: Unit, mb: int, last: Node) -> list[Node]:
        """A unit's gradients are complete for this micro-batch: reduce them when it is time."""
        if self.zero == 3 and not syncs_grads(self.ctx.layout, mb):
            return []  # FSDP2 without gradient sync: accumulated unsharded until the last
        layer = unit.layer
        stream = Stream.ZERO_RS if self.zero == 3 else Stream.DP
        out = []
        partial = self.ctx.tp_partial_params(unit)
        if partial:
            size = partial * self.ctx.grad_bytes
            op = self._collective(OpKind.ALL_REDUCE, stream, unit_label("sp_grads", unit),
                                  SpGrads(unit), self.tp_group, size, layer, mb, Phase.BWD)
            out.append(Node(op, unit, [last]))
        if self.ctx.layout.data_degree == 1:
            return out
        size = self.ctx.unit_params(unit) * self.ctx.grad_bytes
        if self.zero == 3:
            copy_in = self._rs_copy_in(unit, mb, [last, *out])
            if copy_in is not None:
                out.append(copy_in)
                last = copy_in
            op = self._collective(OpKind.REDUCE_SCATTER, stream, unit_label("grads", unit),
                                  UnitGradReduce(unit), self.dp_group, size, layer, mb,
                                  Phase.BWD)
            out.append(Node(op, unit, [last]))
            experts = self._expert_size(unit, self.ctx.grad_bytes)
            if experts:
                op = self._collective(OpKind.REDUCE_SCATTER, stream, "expert_grads",
                                      ExpertGrads(unit), self.edp_group, experts, layer, mb,
                                      Phase.BWD)
                out.append(Node(op, unit, [last]))
            return out
        self.bucket.append(size)
        if unit in self.closes:
            out += self._cut(mb, last)
        return out

    def _end_of_backward(self, mb: int, last: Node) -> list[Node]:
        """The rest of this chunk's gradients; without overlap, ZeRO-2's whole micro-batch."""
        out = self._cut(mb, last)
        if self.every_microbatch and self.deferred:
            out += self.flush_deferred(last, mb)
        return out

    def _cut(self, mb: int, after: Node) -> list[Node]:
        """Close the bucket being filled: reduce it now, or keep it for the end (no overlap)."""
        if not self.bucket or self.ctx.layout.data_degree == 1:
            return []
        size, self.bucket = sum(self.bucket), []
        if not self.ctx.layout.overlap_grad_reduce:
            self.deferred.append(size)
            return []
        return [self._reduce(size, mb, after)]

    def flush_deferred(self, after: Node, mb: int | None = None) -> list[Node]:
        """Every bucket kept for the end of the backward, in order."""
        mb = self.ctx.last_microbatch if mb is None else mb
        out = [self._reduce(size, mb, after) for size in self.deferred]
        self.deferred = []
        return out

    def _reduce(self, size: float, mb: int, after: Node) -> Node:
        kind = OpKind.ALL_REDUCE if self.zero == 0 else OpKind.REDUCE_SCATTER
        index = self.reduced.get(mb, 0)
        self.reduced[mb] = index + 1
        op = self._collective(kind, Stream.DP, "grads", GradBucket(index, mb), self.dp_group,
                              size, None, mb, Phase.BWD)
        return Node(op, None, [after])

    def _collective(self, kind: OpKind, stream: Stream, name: str, purpose: Purpose,
                    group: tuple[int, ...], size: float, layer: int | None, mb: int,
                    phase: Phase) -> Op:
        """Parameters move in the model's dtype, gradients in theirs (fp32 main grads)."""
        params = isinstance(purpose, UnitGather | ExpertUnitGather)
        dtype = self.ctx.model.data_dtype if params else self.ctx.grad_dtype
        return Op(kind=kind, stream=stream, name=name, purpose=purpose, group=group,
                  size_bytes=size, layer=layer, microbatch=mb, phase=phase, dtype=dtype)


def _unit_bounds(on_compute: list[Node]) -> tuple[set[Node], set[Node]]:
    """The first and the last node of each run of one unit among an action's compute-stream
    nodes (a unit's ops are contiguous within an action)."""
    firsts, lasts = set(), set()
    for i, node in enumerate(on_compute):
        if i == 0 or on_compute[i - 1].unit != node.unit:
            firsts.add(node)
        if i == len(on_compute) - 1 or on_compute[i + 1].unit != node.unit:
            lasts.add(node)
    return firsts, lasts
