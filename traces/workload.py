"""The plan of one training step: a pipeline schedule lowered into ops on every rank.

    build(model, layout)            every rank
    build(model, layout, ranks=...) only those (the simulator folds to one rank per stage)

Each action of the rank's pipeline schedule (`traces.pipeline`) becomes ops on streams:

    compute      embedding, per layer attention, MLP and the memory-bound rest ("norm": layer
                 norms, dropouts, residuals, GeLU) in forward, recompute and backward, logits,
                 the optimizer; tensor-parallel collectives run inline here, as in Megatron-LM
                 (TP: all-reduce after attention and after the MLP, the same in backward;
                 TP+SP: all-gather before and reduce-scatter after each instead)
    recv_prev / send_next    activations between pipeline stages (tag "act")
    recv_next / send_prev    their gradients (tag "grad"); receives are posted ahead, and the
                 next pass waits for the previous pass's send (Megatron's blocking p2p)
    dp           gradient buckets (DDP all-reduce, ZeRO-1/2 reduce-scatter), the tied-embedding
                 all-reduce, ZeRO-1/2's parameter all-gather after the optimizer step
    zero_ag / zero_rs        ZeRO-3 (FSDP): per-layer parameter all-gather before forward and
                 backward (prefetching one layer ahead), gradient reduce-scatter after backward

When gradients are reduced: DP and ZeRO-1 once, after the last micro-batch's backward (gradient
accumulation); ZeRO-2 after every micro-batch's backward (gradients stay sharded); ZeRO-3 per
layer and micro-batch, as FSDP does.
"""

from __future__ import annotations

from collections.abc import Iterable

from traces.layout import Layout, Recompute
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Phase, Trace
from traces.pipeline import Action, build_schedule

# Adam reads and writes fp32 master weights, m and v (24 B), reads the bf16 gradient (2 B) and
# writes the bf16 parameter (2 B).
ADAM_BYTES_PER_PARAM = 28
ZERO3_PREFETCH = 1  # layers gathered ahead of the one computing (FSDP's forward prefetch)


def build(model: ModelSpec, layout: Layout, ranks: Iterable[int] | None = None) -> Trace:
    """The plan trace for `ranks` (default: all); the layout must already be validated."""
    schedule = build_schedule(str(layout.schedule), layout.pp, layout.num_microbatches, layout.vp)
    chosen = sorted(ranks) if ranks is not None else list(range(layout.world))
    ops = {r: _RankPlan(model, layout, r).lower(schedule[layout.coords(r)["pp"]]) for r in chosen}
    meta = {
        "model": _model_meta(model),
        "layout": layout.to_dict(),
        "world": layout.world,
        "folded": chosen == layout.representatives() and layout.world > len(chosen),
    }
    return Trace(ops, meta)


def _model_meta(model: ModelSpec) -> dict[str, object]:
    return {f: getattr(model, f) for f in ("layers", "hidden", "heads", "seq_len", "vocab",
                                           "ffn_hidden", "dtype", "tied_embeddings")}


class _RankPlan:
    """Accumulates one rank's ops while walking its schedule."""

    def __init__(self, model: ModelSpec, layout: Layout, rank: int) -> None:
        self.model, self.layout, self.rank = model, layout, rank
        self.coords = layout.coords(rank)
        self.tp_group = layout.group(rank, "tp")
        self.dp_group = layout.group(rank, "dp")
        self.ops: list[Op] = []
        self.b = layout.micro_batch
        self.t = layout.tp
        self.e = model.dtype_bytes
        self.act_bytes = model.activation_bytes(self.b) / (self.t if layout.sp else 1)
        self.block_bytes = model.activation_bytes(self.b)  # TP collective buffer: b*s*h
        self.last_stage = layout.num_stages - 1
        self.head_params = layout.head_params_on_rank(model, self.coords["pp"])
        self.compute_ends: dict[tuple[str, int, int], int] = {}  # (phase, layer, mb) -> op
        self.bucket: list[float] = []  # gradient bytes waiting for the next bucket
        self.bucket_sizes: list[float] = []  # all buckets of the step, for ZeRO-1/2 all-gather
        self.last_on: dict[str, int] = {}
        self.pending_send: int | None = None
        self.block_costs = {phase: self._block_costs(phase) for phase in Phase}

    def _block_costs(self, phase: Phase) -> tuple[list[tuple[str, float, float]], float]:
        """(name, FLOPs, bytes) of attention and MLP in the order the phase runs them, and the
        bytes of the memory-bound rest; backward moves and computes twice the forward."""
        m, b, t, flash = self.model, self.b, self.t, self.layout.flash_attention
        scale = 2.0 if phase is Phase.BWD else 1.0
        subs = [("attn", scale * m.attn_flops(b, t), scale * m.attn_bytes(b, t, flash)),
                ("mlp", scale * m.mlp_flops(b, t), scale * m.mlp_bytes(b, t))]
        norm = scale * m.norm_bytes(b, t, self.layout.sp, flash)
        return (subs[::-1] if phase is Phase.BWD else subs), norm

    # --- bookkeeping ----------------------------------------------------------------------

    def add(self, **fields: object) -> int:
        return self.append(Op(**fields))  # type: ignore[arg-type]

    def append(self, op: Op) -> int:
        self.ops.append(op)
        self.last_on[op.stream] = len(self.ops) - 1
        return len(self.ops) - 1

    def compute(self, name: str, phase: Phase, flops: float, mem_bytes: float, *,
                layer: int | None = None, mb: int | None = None, deps: list[int] | None = None
                ) -> int:
        return self.append(Op(kind=OpKind.COMPUTE, stream="compute", name=name, phase=phase,
                              flops=flops, mem_bytes=mem_bytes, layer=layer, microbatch=mb,
                              deps=tuple(deps) if deps else ()))

    def collective(self, kind: OpKind, stream: str, group: tuple[int, ...], size: float, *,
                   layer: int | None = None, mb: int | None = None, phase: Phase | None = None,
                   deps: list[int] | None = None) -> int:
        return self.append(Op(kind=kind, stream=stream, group=group, size_bytes=size,
                              layer=layer, microbatch=mb, phase=phase,
                              deps=tuple(deps) if deps else (), dtype=self.model.dtype))

    def peer(self, stage: int) -> int:
        return self.layout.rank(**{**self.coords, "pp": stage % self.layout.pp})

    # --- lowering -------------------------------------------------------------------------

    def lower(self, actions: list[Action]) -> tuple[Op, ...]:
        last_mb = self.layout.num_microbatches - 1
        for action in actions:
            if action.kind == "F":
                self.forward(action.stage, action.microbatch)
            else:
                self.backward(action.stage, action.microbatch,
                              final=action.microbatch == last_mb)
        self.optimizer_step()
        return tuple(self.ops)

    def sent(self) -> list[int]:
        """Megatron-LM's pipeline sends are blocking: the next pass starts once the previous
        pass's output has been handed over (receives are posted ahead, so this never
        deadlocks)."""
        pending, self.pending_send = self.pending_send, None
        return [] if pending is None else [pending]

    def forward(self, stage: int, mb: int) -> None:
        deps = self.sent()
        if stage > 0:
            deps.append(self.add(kind=OpKind.RECV, stream="recv_prev", peer=self.peer(stage - 1),
                                 size_bytes=self.act_bytes, tag="act", microbatch=mb))
        if stage == 0:
            deps += self.zero3_gather(self.model.embedding_params(self.t), mb, Phase.FWD)
            self.compute("embed", Phase.FWD, 0.0, self.model.embed_bytes(self.b), mb=mb, deps=deps)
            deps = []
        for layer in self.layout.layers_of_stage(self.model, stage):
            self.block(layer, mb, Phase.FWD, deps)
            deps = []
        if stage == self.last_stage:
            deps += self.zero3_gather(self.head_params, mb, Phase.FWD)
            self.compute("head", Phase.FWD, self.model.head_flops(self.b, self.t),
                         self.model.head_bytes(self.b, self.t), mb=mb, deps=deps)
        else:
            self.pending_send = self.add(
                kind=OpKind.SEND, stream="send_next", peer=self.peer(stage + 1),
                size_bytes=self.act_bytes, tag="act", microbatch=mb,
                deps=(self.last_on["compute"],))

    def backward(self, stage: int, mb: int, final: bool) -> None:
        deps = self.sent()
        if stage < self.last_stage:
            deps.append(self.add(kind=OpKind.RECV, stream="recv_next", peer=self.peer(stage + 1),
                                 size_bytes=self.act_bytes, tag="grad", microbatch=mb))
        else:
            deps += self.zero3_gather(self.head_params, mb, Phase.BWD)
            self.compute("head", Phase.BWD, 2 * self.model.head_flops(self.b, self.t),
                         2 * self.model.head_bytes(self.b, self.t), mb=mb, deps=deps)
            deps = []
            self.grads_ready(self.head_params, mb, final)
        for layer in reversed(self.layout.layers_of_stage(self.model, stage)):
            deps += self.zero3_gather(self.model.layer_params(self.t), mb, Phase.BWD, layer)
            if self.layout.recompute is Recompute.FULL:
                self.block(layer, mb, Phase.RECOMPUTE, deps, gather=False)
                deps = []
            elif self.layout.recompute is Recompute.SELECTIVE:
                self.compute("attn_core", Phase.RECOMPUTE,
                             self.model.attn_core_flops(self.b, self.t), 0.0, layer=layer, mb=mb,
                             deps=deps)
                deps = []
            self.block(layer, mb, Phase.BWD, deps, gather=False)
            deps = []
            self.grads_ready(self.model.layer_params(self.t), mb, final, layer)
        if stage == 0:
            deps = self.zero3_gather(self.model.embedding_params(self.t), mb, Phase.BWD)
            self.compute("embed", Phase.BWD, 0.0, 2 * self.model.embed_bytes(self.b), mb=mb,
                         deps=deps)
            self.grads_ready(self.model.embedding_params(self.t), mb, final)
        else:
            self.pending_send = self.add(
                kind=OpKind.SEND, stream="send_prev", peer=self.peer(stage - 1),
                size_bytes=self.act_bytes, tag="grad", microbatch=mb,
                deps=(self.last_on["compute"],))
        if final or self.layout.zero == 2:
            self.flush_bucket(mb)  # the rest of this chunk's gradients

    def block(self, layer: int, mb: int, phase: Phase, deps: list[int],
              gather: bool = True) -> None:
        """Attention then MLP (reverse order in backward), each with its TP/SP collectives."""
        if gather:
            deps = deps + self.zero3_gather(self.model.layer_params(self.t), mb, phase, layer)
        subs, norm_bytes = self.block_costs[phase]
        if phase is Phase.BWD:  # gradients of the norms, dropouts and residuals come first
            self.compute("norm", phase, 0.0, norm_bytes, layer=layer, mb=mb, deps=deps)
            deps = []
        for name, flops, mem in subs:
            if self.layout.sp:  # gather the sequence shards in, scatter the result out
                self.collective(OpKind.ALL_GATHER, "compute", self.tp_group, self.block_bytes,
                                layer=layer, mb=mb, phase=phase, deps=deps)
                deps = []
            self.compute(name, phase, flops, mem, layer=layer, mb=mb, deps=deps)
            deps = []
            if self.t > 1:
                kind = OpKind.REDUCE_SCATTER if self.layout.sp else OpKind.ALL_REDUCE
                self.collective(kind, "compute", self.tp_group, self.block_bytes, layer=layer,
                                mb=mb, phase=phase)
        if phase is not Phase.BWD:
            self.compute("norm", phase, 0.0, norm_bytes, layer=layer, mb=mb)
        self.compute_ends[(str(phase), layer, mb)] = self.last_on["compute"]

    # --- data parallelism and ZeRO -----------------------------------------------------------

    def zero3_gather(self, params: float, mb: int, phase: Phase,
                     layer: int | None = None) -> list[int]:
        """ZeRO-3: all-gather a unit's parameters; returns what its compute must wait for.

        The gather of layer l waits until layer l -+ (ZERO3_PREFETCH + 1) has finished, so at
        most two layers are unsharded at once: one computing, one prefetched.
        """
        if self.layout.zero != 3 or self.layout.dp == 1:
            return []
        deps = []
        if layer is not None:
            ahead = ZERO3_PREFETCH + 1
            back = layer + ahead if phase is Phase.BWD else layer - ahead
            done = self.compute_ends.get((str(phase), back, mb))
            deps = [done] if done is not None else []
        return [self.collective(OpKind.ALL_GATHER, "zero_ag", self.dp_group, params * self.e,
                                layer=layer, mb=mb, phase=phase, deps=deps)]

    def grads_ready(self, params: float, mb: int, final: bool, layer: int | None = None) -> None:
        """A unit's gradients are complete for this micro-batch: reduce them when it is time."""
        if self.layout.dp == 1:
            return
        after = self.last_on["compute"]
        size = params * self.e
        if self.layout.zero == 3:
            self.collective(OpKind.REDUCE_SCATTER, "zero_rs", self.dp_group, size, layer=layer,
                            mb=mb, phase=Phase.BWD, deps=[after])
            return
        if self.layout.zero == 2 or final:
            self.bucket.append(size)
            if sum(self.bucket) >= self.layout.bucket_bytes:
                self.flush_bucket(mb)

    def flush_bucket(self, mb: int) -> None:
        if not self.bucket or self.layout.dp == 1:
            return
        size = sum(self.bucket)
        self.bucket = []
        kind = OpKind.ALL_REDUCE if self.layout.zero == 0 else OpKind.REDUCE_SCATTER
        self.collective(kind, "dp", self.dp_group, size, mb=mb, phase=Phase.BWD,
                        deps=[self.last_on["compute"]])
        if self.layout.zero in (1, 2) and mb == self.layout.num_microbatches - 1:
            self.bucket_sizes.append(size)

    def optimizer_step(self) -> None:
        if self.layout.pp > 1 and self.model.tied_embeddings and self.owns_embeddings():
            self.collective(OpKind.ALL_REDUCE, "dp", self.layout.embedding_group(self.rank),
                            self.model.vocab * self.model.hidden / self.t * self.e,
                            phase=Phase.BWD, deps=[self.last_on["compute"]])
        waits = [self.last_on[s] for s in ("dp", "zero_rs") if s in self.last_on] + self.sent()
        params = self.layout.params_on_rank(self.model, self.coords["pp"])
        shard = self.layout.dp if self.layout.zero >= 1 else 1
        step = self.compute("optimizer", Phase.OPT, 0.0, params / shard * ADAM_BYTES_PER_PARAM,
                            deps=waits)
        if self.layout.zero in (1, 2) and self.layout.dp > 1:
            for size in self.bucket_sizes:  # updated shards back to every replica
                self.collective(OpKind.ALL_GATHER, "dp", self.dp_group, size, phase=Phase.OPT,
                                deps=[step])

    def owns_embeddings(self) -> bool:
        stages = self.layout.stages_of_rank(self.coords["pp"])
        return 0 in stages or self.last_stage in stages
