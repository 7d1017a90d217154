"""Pass 1: schedule actions to compute ops, one per kernel (`traces.kernels`).

Each action `sFm` / `sBm` of the rank's schedule becomes the kernels of virtual stage s for
micro-batch m, in the order a GPU runs them: forward — embed and pos_embed on the first stage,
each layer's kernels, final_ln, logits and cross_entropy on the last; backward — the same in
reverse, each kernel with its own backward cost, a layer's recomputation right before its
backward (`full`: the layer's forward kernels, re-run before its backward; `selective`: only the
attention core, re-run when the backward reaches it, as Megatron-LM's `core_attn`
recomputation does). Nothing else: the later passes add communication.
"""

from __future__ import annotations

from collections.abc import Sequence

from traces import op_sac
from traces.expert_grid import ep_coord
from traces.kernel_groups import ATTENTION_CORE
from traces.kernels import KernelWork, embedding_kernels, head_kernels
from traces.layout import Recompute
from traces.model import ModelSpec
from traces.moe import ExpertShard, moe_layer_kernels
from traces.moe_spec import is_moe_layer
from traces.mtp import mtp_indices
from traces.mtp_kernels import mtp_kernels
from traces.ops import OpKind, OpRow, Phase, Stream, op_row, stamp
from traces.pipeline import Action
from traces.plan.nodes import Node, Program, RankContext
from traces.purpose import EMBED, HEAD, Kernel, KernelRun, Unit
from traces.recompute import recomputed_kernels
from traces.stack import restack
from traces.zero_bubble import split_backward, splits_backward


def lower_compute(ctx: RankContext, actions: list[Action],
                  tables: KernelTables | None = None) -> Program:
    """The compute ops of every action, tagged with their unit; an empty end of the step.
    Spends them on the context's budget before building any. Takes the rank's kernel table
    from `tables` where `count_compute` left it (same model and layout), else makes it."""
    kept = tables.take(ctx.rank) if tables is not None else None
    kernels = kept if kept is not None else \
        _StageKernels(ctx, tables.rows if tables is not None else None)
    if ctx.budget is not None:
        ctx.budget.spend(sum(kernels.count(a) for a in actions))
    program = [kernels.nodes(a) for a in actions]
    return [*program, []]


def count_compute(ctx: RankContext, tables: KernelTables | None = None) -> int:
    """The number of ops `lower_compute` builds for the rank, without its schedule: every
    pipeline schedule runs each of the rank's virtual stages forward and backward once per
    micro-batch (`traces.pipeline` validates it), in whatever order. Leaves the rank's kernel
    table in `tables` for `lower_compute` to build from."""
    kernels = _StageKernels(ctx, tables.rows if tables is not None else None)
    if tables is not None:
        tables.keep(ctx.rank, kernels)
    once = sum(kernels.count(Action(stage, kind, 0))
               for stage in ctx.layout.stages_of_rank(ctx.pp_rank) for kind in ("F", "B", "W"))
    return ctx.layout.num_microbatches * once


Rows = dict[tuple[KernelWork, Phase], OpRow]
"""Op rows made once per (kernel, phase) (`_fields`)."""


class KernelTables:
    """Ranks' kernel tables (one model and layout), made once per plan: the op-cap check
    counts from each (`count_compute`) and lowering takes it to build from (`lower_compute`),
    so a skewed 1024-GPU plan, where ~1000 ranks each have their own, makes each once."""

    __slots__ = ("_kept", "rows")

    def __init__(self) -> None:
        self._kept: dict[int, _StageKernels] = {}
        self.rows: Rows = {}
        """Op rows by (kernel, phase), shared by every rank's table (`_fields`)."""

    def keep(self, rank: int, kernels: _StageKernels) -> None:
        self._kept[rank] = kernels

    def take(self, rank: int) -> _StageKernels | None:
        """The rank's table, no longer kept (lowered once: its memory goes with its plan's)."""
        return self._kept.pop(rank, None)

    def clear(self) -> None:
        """Keep none (a plan refused: its tables are not built from)."""
        self._kept.clear()


Segment = tuple[list[OpRow], Sequence[Unit]]
"""A run of kernels (their ops' rows, `traces.ops.op_row`) and the units it runs for, one
after another."""


class _StageKernels:
    """The kernels of a layer, of the embedding and of the output layer for this rank."""

    def __init__(self, ctx: RankContext, rows: Rows | None = None) -> None:
        """`rows`: op rows made before (by other ranks of the plan), reused and added to."""
        model, layout = ctx.local_model, ctx.layout  # CP: the rank's s/cp tokens
        rows = rows if rows is not None else {}
        b, t, sp = layout.micro_batch, layout.tp, layout.sp
        g = ctx.grad_bytes
        self.ctx = ctx
        embed = embedding_kernels(model, b, t, sp, g)
        head = restack(model, head_kernels(model, b, t, sp, g), b, t, sp)
        # One kernel list per distinct kind of layer: dense, MoE (per layer with skewed routing).
        self.runs: dict[object, tuple[list[OpRow], list[OpRow], list[OpRow]]] = {}
        split = splits_backward(layout.schedule)
        self.keys: dict[int, object] = {}
        shard = ExpertShard(ep=layout.ep, etp=layout.etp, ep_rank=ep_coord(layout, ctx.rank))
        for stage in layout.stages_of_rank(ctx.pp_rank):
            for index in layout.layers_of_stage(model, stage):
                moe = is_moe_layer(model, index)
                key = self.keys[index] = (moe, index if moe and model.routing_skew
                                                       and not model.force_balance else None)
                if key not in self.runs:
                    layer = restack(model, moe_layer_kernels(model, b, t, sp, index, shard, g),
                                    b, t, sp)
                    backward = _layer_backward(layer, layout.recompute,
                                               ATTENTION_CORE[model.attention], model,
                                               layout.recompute_modules, moe)
                    self.runs[key] = (_fields(_run(layer, Phase.FWD), rows),
                                      *_split(backward, split, rows))
        self.embed_forward = _fields(_run(embed, Phase.FWD), rows)
        self.embed_backward, self.embed_wgrad = _split(_run(embed[::-1], Phase.BWD), split, rows)
        depth = mtp_kernels(model, b, t, sp, g) if model.mtp_layers else []
        self.mtp_forward = self.embed_forward + _fields(_run(depth, Phase.FWD), rows)
        depth_backward, depth_wgrad = _split(_run(depth[::-1], Phase.BWD), split, rows)
        self.mtp_backward = depth_backward + self.embed_backward
        self.mtp_wgrad = depth_wgrad + self.embed_wgrad
        self.head_forward = _fields(_run(head, Phase.FWD), rows)
        self.head_backward, self.head_wgrad = _split(_run(head[::-1], Phase.BWD), split, rows)
        # The layer units of each virtual stage, made once (a plan has ~10^6 actions' worth);
        # the MTP depths (`traces.mtp`, layers L.. of the last stage) apart.
        self.layers = {stage: _by_kind(_main(layout.layers_of_stage(model, stage), model.layers),
                                       self.keys)
                       for stage in layout.stages_of_rank(ctx.pp_rank)}
        self.mtp = _by_kind(mtp_indices(model), self.keys) \
            if ctx.last_stage in layout.stages_of_rank(ctx.pp_rank) else []

    def segments(self, action: Action) -> list[Segment]:
        """What `action` runs, in order: forward — the embedding on the first stage, the
        layers, the output layer on the last; backward — the same in reverse."""
        runs = self.layers[action.stage]
        first, last = action.stage == 0, action.stage == self.ctx.last_stage
        if action.kind == "F":
            return [*([(self.embed_forward, (EMBED,))] if first else []),
                    *((self.runs[key][0], units) for key, units in runs),
                    *(self._mtp_forward() if last else []),
                    *([(self.head_forward, (HEAD,))] if last else [])]
        w = action.kind == "W"  # a split backward's weight gradients (`traces.zero_bubble`)
        head, embed = (self.head_wgrad, self.embed_wgrad) if w else \
            (self.head_backward, self.embed_backward)
        return [*([(head, (HEAD,))] if last else []),
                *(self._mtp_backward(w) if last else []),
                *((self.runs[key][2 if w else 1], units[::-1]) for key, units in runs[::-1]),
                *([(embed, (EMBED,))] if first else [])]

    def _mtp_forward(self) -> list[Segment]:
        """Each MTP depth: the lookup of the shifted tokens in the embedding copy, its norms,
        concatenation and eh_proj (`traces.mtp_kernels`), its layer
        (with its unit: the copy's and the depth's own parameters are there, `traces.mtp`);
        then each depth's final norm, logits and cross-entropy on the shared output layer,
        before the main model's (Megatron-Core's process_mtp_loss runs them first)."""
        out: list[Segment] = []
        for key, units in self.mtp:
            for unit in units:
                out += [(self.mtp_forward, (unit,)), (self.runs[key][0], (unit,))]
        return [*out, *([(self.head_forward, (HEAD,) * len(out[::2]))] if out else [])]

    def _mtp_backward(self, w: bool = False) -> list[Segment]:
        """`_mtp_forward` in reverse, each kernel with its backward (`w`: its weight
        gradients of a split backward)."""
        out: list[Segment] = []
        depth, head = (self.mtp_wgrad, self.head_wgrad) if w else \
            (self.mtp_backward, self.head_backward)
        for key, units in self.mtp[::-1]:
            for unit in units[::-1]:
                out += [(self.runs[key][2 if w else 1], (unit,)), (depth, (unit,))]
        return [*([(head, (HEAD,) * len(out[::2]))] if out else []), *out]

    def count(self, action: Action) -> int:
        """The number of ops `nodes(action)` builds."""
        return sum(len(run) * len(units) for run, units in self.segments(action))

    def nodes(self, action: Action) -> list[Node]:
        mb, nodes = action.microbatch, []
        for run, units in self.segments(action):
            for unit in units:
                nodes += _nodes(run, unit, unit.layer, mb)
        return nodes


Run = list[tuple[KernelWork, Phase]]


def _by_kind(layers: range, keys: dict[int, object]) -> list[tuple[object, tuple[Unit, ...]]]:
    """Consecutive layers with the same kernels, as (their kind, their units)."""
    out: list[tuple[object, tuple[Unit, ...]]] = []
    for index in layers:
        if out and out[-1][0] == keys[index]:
            out[-1] = (keys[index], (*out[-1][1], Unit.of_layer(index)))
        else:
            out.append((keys[index], (Unit.of_layer(index),)))
    return out


def _main(layers: range, main: int) -> range:
    """The main model's layers of a stage's range (the MTP depths, from index `main`, run
    apart)."""
    return range(layers.start, min(layers.stop, main)) if layers.stop > main else layers


def _run(kernels: list[KernelWork], phase: Phase) -> Run:
    """The kernels that do work in `phase` (an FP8 cast runs in one phase only)."""
    backward = phase is Phase.BWD
    return [(k, phase) for k in kernels if k.launches is not None or
            (k.bwd_flops or k.bwd_bytes if backward else k.flops or k.mem_bytes)]


def _layer_backward(layer: list[KernelWork], recompute: Recompute, core: tuple[Kernel, ...],
                    model: ModelSpec, modules: tuple[str, ...] = (), moe: bool = False) -> Run:
    """A layer's backward kernels with its recomputation: `full` re-runs the whole forward
    first, `selective_op` what torchtitan's per-op policy did not save (`traces.op_sac`);
    `selective` re-runs the attention core when the backward reaches it (where autograd
    meets the checkpointed core); `modules` (recompute_modules) first the output-discarding
    modules' kernels (`traces.recompute`), then the core only where core_attn is listed."""
    backward = _run(layer[::-1], Phase.BWD)
    if modules:
        again = _run(recomputed_kernels(layer, modules, moe), Phase.RECOMPUTE)
        rest = recompute if "core_attn" in modules else Recompute.NONE
        return again + _layer_backward(layer, rest, core, model)
    if recompute is Recompute.FULL:
        return _run(layer, Phase.RECOMPUTE) + backward
    if recompute is Recompute.SELECTIVE_OP:
        return _run(op_sac.recomputed_kernels(model, layer), Phase.RECOMPUTE) + backward
    if recompute is Recompute.SELECTIVE:
        at = next(i for i, (k, _) in enumerate(backward) if k.name in core)
        return backward[:at] + _run([k for k in layer if k.name in core],
                                    Phase.RECOMPUTE) + backward[at:]
    return backward


def _nodes(run: list[OpRow], unit: Unit, layer: int | None, mb: int) -> list[Node]:
    """One node per kernel of `run` (the ops' rows, prepared once, stamped with the layer and
    micro-batch: a 1024-GPU plan builds ~10^6 of these)."""
    return [Node(stamp(row, layer, mb), unit) for row in run]


def _split(run: Run, split: bool, rows: Rows) -> tuple[list[OpRow], list[OpRow]]:
    """A backward run's rows, whole (and no W), or split into B's and W's
    (`traces.zero_bubble.split_backward`)."""
    if not split:
        return _fields(run, rows), []
    b, w = split_backward(run)
    return _fields(b, rows), _fields(w, rows)


def _fields(run: Run, rows: Rows) -> list[OpRow]:
    """The op row of each kernel in its phase, made once per (kernel, phase) in `rows`: the
    row is a function of the two (equal kernels, equal rows), and with skewed routing ~1000
    ranks each have their own table, mostly of the same kernels (attention, norms, the
    dense layers' GEMMs); only their experts' differ."""
    out = []
    for k, phase in run:
        row = rows.get((k, phase))
        if row is None:
            row = rows[(k, phase)] = _row(k, phase)
        out.append(row)
    return out


def _row(k: KernelWork, phase: Phase) -> OpRow:
    back = (Phase.BWD, Phase.WGRAD)
    return op_row(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=str(k.name),
                  purpose=KernelRun(k.name), phase=phase,
                  flops=k.bwd_flops if phase in back else k.flops,
                  mem_bytes=k.bwd_bytes if phase in back else k.mem_bytes,
                  draws=k.bwd_draws if phase in back else k.draws,
                  gemm=k.gemm or (), **({"dtype": "fp4" if k.fp4 else "fp8"} if k.fp8 else {}))
