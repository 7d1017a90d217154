"""The plan builder: a model and a layout to the plan trace both interpreters run.

    from traces.plan import build
    plan = build(model, layout)                               # every rank
    plan = build(model, layout, ranks=layout.representatives())  # folded: one per pipeline rank

Each rank's schedule (`traces.pipeline`: a list of actions such as `0F3`, `2B1`) is lowered by
small passes, each a function over the list of ops being built (`traces.plan.nodes.Node`):

    compute.lower_compute          actions -> compute ops (embedding, layers, output layer)
    tensor.add_tensor_parallel     TP / SP collectives around attention and the MLP
    p2p.add_pipeline_p2p           sends and receives between pipeline stages
    data.add_data_parallel         gradient buckets (DDP, ZeRO-1/2), ZeRO-3 gathers and scatters
    optimizer.add_optimizer        tied-embedding all-reduce, optimizer step, ZeRO-1/2 gathers

and `nodes.finalize` numbers the result into the rank's op tuple. See docs/plan-ops.md for the
ops and streams, and each pass's docstring for what it adds.
"""

from __future__ import annotations

from collections.abc import Iterable

from traces.errors import ConfigError
from traces.header import TraceMeta
from traces.kernels import ATTENTION_CORE, layer_kernels
from traces.layout import Layout
from traces.model import ModelSpec
from traces.nogc import paused_gc
from traces.ops import Op, Trace
from traces.pipeline import build_schedule
from traces.plan.compute import lower_compute
from traces.plan.data import add_data_parallel
from traces.plan.nodes import RankContext, finalize
from traces.plan.optimizer import add_optimizer
from traces.plan.p2p import add_pipeline_p2p
from traces.plan.tensor import add_tensor_parallel

__all__ = ["MAX_PLAN_OPS", "build", "count_ops", "lower_rank"]

MAX_PLAN_OPS = 10_000_000
"""The most ops parasim builds in one plan (~4 GB of memory; GPT-3 175B folded on 1024 GPUs
holds 0.84 M, a 1T model folded on 3072 GPUs ~3.5 M)."""


def build(model: ModelSpec, layout: Layout, ranks: Iterable[int] | None = None) -> Trace:
    """The plan trace for `ranks` (default: all); the layout must fit the model. Raises
    ConfigError before building anything when the plan would exceed MAX_PLAN_OPS ops."""
    chosen = sorted(ranks) if ranks is not None else list(range(layout.world))
    estimate = count_ops(model, layout, len(chosen))
    if estimate > MAX_PLAN_OPS:
        folding = ("" if len(chosen) <= len(layout.representatives())
                   else "; or simulate folded, one rank per pipeline stage")
        raise ConfigError(f"plan: about {estimate:,} ops for {len(chosen):,} ranks, more than "
                          f"the {MAX_PLAN_OPS:,} parasim builds (fewer micro-batches or layers"
                          f"{folding})")
    schedule = build_schedule(str(layout.schedule), layout.pp, layout.num_microbatches, layout.vp)
    with paused_gc():
        ops = {r: lower_rank(model, layout, r, schedule[layout.coords(r)["pp"]]) for r in chosen}
    folded = chosen == layout.representatives() and layout.world > len(chosen)
    return Trace(ops, TraceMeta(model=model, layout=layout, world=layout.world,
                                fold=layout if folded else None))


def count_ops(model: ModelSpec, layout: Layout, num_ranks: int) -> int:
    """Ops a plan of `num_ranks` ranks holds, within a few percent, without building it:
    per layer and micro-batch its kernels forward, backward and recomputed, its TP/SP
    collectives and ZeRO-3's gathers and scatters; per micro-batch the embedding, the output
    layer and the pipeline's sends and receives."""
    kernels = len(layer_kernels(model, 1, 1, False))
    recomputed = {"none": 0, "selective": len(ATTENTION_CORE[model.attention]),
                  "full": kernels}[str(layout.recompute)]
    # TP collectives per layer: forward 2 (SP: 4), again when fully recomputed, backward 2
    # (SP: 6, the column-parallel inputs re-gathered)
    forward_tp = 4 if layout.sp else 2
    tp = forward_tp * (2 if str(layout.recompute) == "full" else 1) + (6 if layout.sp else 2)
    per_layer = 2 * kernels + recomputed + (tp if layout.tp > 1 else 0) + (
        4 if layout.zero == 3 else 0)
    layers = model.layers // layout.pp  # per rank, over its model chunks
    per_microbatch = layers * per_layer + 24 + 2 * layout.vp  # + a gather per receive
    return num_ranks * (layout.num_microbatches * per_microbatch + 64)


def lower_rank(model: ModelSpec, layout: Layout, rank: int, actions: list) -> tuple[Op, ...]:
    """One rank's ops: its schedule actions through every pass."""
    ctx = RankContext(model=model, layout=layout, rank=rank)
    nodes = lower_compute(ctx, actions)
    nodes = add_tensor_parallel(ctx, nodes)
    nodes = add_pipeline_p2p(ctx, actions, nodes)
    nodes = add_data_parallel(ctx, actions, nodes)
    nodes = add_optimizer(ctx, nodes)
    return finalize(nodes)

