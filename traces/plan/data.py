"""Pass 4: data parallelism — gradient buckets (DDP, ZeRO-1/2) and ZeRO-3's gathers.

When gradients are reduced over the DP group:
    ZeRO 0 and 1   once, in the last micro-batch's backward (gradient accumulation): units'
                   gradients fill 25 MiB buckets in backward order; a full bucket is reduced
                   (all-reduce for ZeRO 0, reduce-scatter for ZeRO 1) as soon as it is full,
                   the rest at the end of each model chunk's backward
    ZeRO 2         the same in every micro-batch's backward (gradients stay sharded)
    ZeRO 3         per unit and micro-batch, a reduce-scatter right after the unit's backward
ZeRO-3 (FSDP) also all-gathers each unit's parameters before its forward and its backward. The
gather of layer l waits until layer l ∓ (ZERO3_PREFETCH + 1) has finished in the same phase,
so at most two layers are unsharded at once: one computing, one prefetched.

A unit's gradients are complete after the last op it runs on the compute stream; reductions
wait for that op, gathers are waited for by the unit's first op on the compute stream.
"""

from __future__ import annotations

from traces.ops import Op, OpKind, Phase, Stream
from traces.pipeline import Action
from traces.plan.nodes import Node, Program, RankContext, Unit

ZERO3_PREFETCH = 1  # layers gathered ahead of the one computing (FSDP's forward prefetch)


def add_data_parallel(ctx: RankContext, actions: list[Action], program: Program) -> Program:
    """Insert ZeRO-3 gathers and gradient reductions; `program[k]` holds `actions[k]`'s ops."""
    if ctx.layout.dp == 1:
        return program
    walk = _DataWalk(ctx)
    out = [walk.action(action, nodes) for action, nodes in zip(actions, program)]
    return [*out, *program[len(actions):]]


class _DataWalk:
    """The state a walk over one rank's actions carries: the bucket being filled, and where
    each layer's compute ended per (phase, layer, micro-batch) for ZeRO-3's prefetch limit."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self.group = ctx.layout.group(ctx.rank, "dp")
        self.bytes_per_param = ctx.model.dtype_bytes
        self.bucket: list[float] = []
        self.ends: dict[tuple[Phase, int, int], Node] = {}

    def action(self, action: Action, group: list[Node]) -> list[Node]:
        zero, mb = self.ctx.layout.zero, action.microbatch
        phase = Phase.FWD if action.kind == "F" else Phase.BWD
        final = mb == self.ctx.last_microbatch
        reduce_grads = action.kind == "B" and zero != 3 and (final or zero == 2)
        if zero != 3 and not reduce_grads:
            return group  # gradients accumulate locally in this micro-batch
        on_compute = [node for node in group if node.on_compute]
        firsts, lasts = _unit_bounds(on_compute)
        out: list[Node] = []
        for node in group:
            unit = node.unit
            if zero == 3 and unit is not None and node in firsts:
                gather = self._gather(unit, mb, phase)
                out.append(gather)
                node.after.append(gather)
            out.append(node)
            if node.on_compute and node.op.layer is not None and node.op.phase is not None:
                self.ends[(node.op.phase, node.op.layer, mb)] = node
            if action.kind == "B" and unit is not None and node in lasts:
                out += self._grads_ready(unit, mb, node, reduce_grads)
        if reduce_grads:
            out += self._flush(mb, on_compute[-1])
        return out

    def _gather(self, unit: Unit, mb: int, phase: Phase) -> Node:
        waits: list[Node] = []
        layer = unit if isinstance(unit, int) else None
        if layer is not None:
            ahead = ZERO3_PREFETCH + 1
            done = self.ends.get((phase, layer + ahead if phase is Phase.BWD else layer - ahead,
                                  mb))
            waits = [done] if done is not None else []
        size = self.ctx.unit_params(unit) * self.bytes_per_param
        return Node(self._collective(OpKind.ALL_GATHER, Stream.ZERO_AG, size, layer, mb, phase),
                    unit, waits)

    def _grads_ready(self, unit: Unit, mb: int, last: Node, reduce_grads: bool) -> list[Node]:
        """A unit's gradients are complete for this micro-batch: reduce them when it is time."""
        size = self.ctx.unit_params(unit) * self.bytes_per_param
        if self.ctx.layout.zero == 3:
            layer = unit if isinstance(unit, int) else None
            op = self._collective(OpKind.REDUCE_SCATTER, Stream.ZERO_RS, size, layer, mb,
                                  Phase.BWD)
            return [Node(op, unit, [last])]
        if not reduce_grads:
            return []
        self.bucket.append(size)
        if sum(self.bucket) >= self.ctx.layout.bucket_bytes:
            return self._flush(mb, last)
        return []

    def _flush(self, mb: int, after: Node) -> list[Node]:
        if not self.bucket:
            return []
        size = sum(self.bucket)
        self.bucket = []
        kind = OpKind.ALL_REDUCE if self.ctx.layout.zero == 0 else OpKind.REDUCE_SCATTER
        return [Node(self._collective(kind, Stream.DP, size, None, mb, Phase.BWD), None, [after])]

    def _collective(self, kind: OpKind, stream: Stream, size: float, layer: int | None,
                    mb: int, phase: Phase) -> Op:
        return Op(kind=kind, stream=stream, group=self.group, size_bytes=size, layer=layer,
                  microbatch=mb, phase=phase, dtype=self.ctx.model.dtype)


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
