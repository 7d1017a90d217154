"""The plan builder: a model and a layout to the plan trace both interpreters run.

    from traces.plan import build
    plan = build(model, layout)                               # every rank
    plan = build(model, layout, ranks=layout.representatives())  # folded: one per pipeline rank

Each rank's schedule (`traces.pipeline`: a list of actions such as `0F3`, `2B1`) is lowered by
small passes, each a function over the list of ops being built (`traces.plan.nodes.Node`):

    compute.lower_compute          actions -> compute ops (embedding, layers, output layer)
    tensor.add_tensor_parallel     TP / SP collectives around attention and the MLP
    experts.add_expert_parallel    MoE: the EP all-to-alls (and ETP collectives) per layer
    context.add_context_parallel   CP: the attention core's K/V ring (or all-gather)
    p2p.add_pipeline_p2p           sends and receives between pipeline stages
    data.add_data_parallel         gradient buckets (DDP, ZeRO-1/2), ZeRO-3 gathers and scatters
    experts.add_expert_grads       MoE: routed experts' gradients over expert-DP
    optimizer.add_optimizer        tied-embedding all-reduce, optimizer step, ZeRO-1/2 gathers
    fp8.add_fp8                    FP8: amax reductions (delayed scaling), the weights' cast
    moe_overlap.overlap_moe_comm   overlap_moe_comm: EP all-to-alls on their stream, pairs merged
    offload.add_cpu_offload        cpu_offloading_num_layers: activation copies to host and back

and `nodes.finalize` numbers the result into the rank's op tuple. See docs/plan-ops.md for the
ops and streams, and each pass's docstring for what it adds.

A rank's ops depend on its pipeline coordinate only (the others change its groups and peers,
not how many ops it has), and under skewed routing on its experts' loads
(`traces.moe.expert_loads`: one grouped GEMM per distinct token count). So the builder lowers
the first chosen rank of each pipeline coordinate and load first, spending each op on an
`OpBudget` once per chosen rank that shares them: the passes count the plan's size
themselves, a plan over MAX_PLAN_OPS is refused before the rest is built, and the ranks
lowered are kept. Before all that, their compute ops alone are counted from each stand-in's
kernel table, which lowering then builds from (`compute.KernelTables`: made once, not twice).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from traces.errors import ConfigError
from traces.header import TraceMeta
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe import expert_loads
from traces.moe_overlap import check_pairs
from traces.nogc import paused_gc
from traces.ops import Op, Trace
from traces.pipeline import Action, ActionSchedule, layout_schedule
from traces.plan.budget import OpBudget, OverBudget
from traces.plan.compute import KernelTables, count_compute, lower_compute
from traces.plan.context import add_context_parallel
from traces.plan.data import add_data_parallel
from traces.plan.experts import add_expert_grads, add_expert_parallel
from traces.plan.fp8 import add_fp8
from traces.plan.moe_overlap import overlap_moe_comm
from traces.plan.nodes import Program, RankContext, finalize
from traces.plan.offload import add_cpu_offload
from traces.plan.optimizer import add_optimizer
from traces.plan.p2p import add_pipeline_p2p
from traces.plan.tensor import add_tensor_parallel

__all__ = ["MAX_PLAN_OPS", "build", "layout_schedule", "lower_rank", "plan_size"]

MAX_PLAN_OPS = 10_000_000
"""The most ops parasim builds in one plan (~4 GB of memory; GPT-3 175B folded on 1024 GPUs
holds 0.84 M, a 1T model folded on 3072 GPUs ~3.5 M)."""


def build(model: ModelSpec, layout: Layout, ranks: Iterable[int] | None = None, *,
          schedule: ActionSchedule | None = None, classes: bool = False,
          progress: Callable[[int, int], None] | None = None) -> Trace:
    """The plan trace for `ranks` (default: all) under `schedule` (default: the layout's own,
    `layout_schedule`); the layout must fit the model. Raises ConfigError, before building
    the rest, once the ops lowered so far stand for more than MAX_PLAN_OPS ops of the plan
    (`classes`: `ranks` are already one per class of identical ranks, `traces.identity`, so
    the message does not suggest folding). `progress(done, total)` after each rank lowered."""
    chosen = sorted(ranks) if ranks is not None else list(range(layout.world))
    with paused_gc():  # it keeps the stand-ins' kernel tables, ~10^5 objects (no cycles)
        tables = _check_compute(model, layout, chosen, classes)  # before the schedule: big?
    if schedule is None:
        schedule = layout_schedule(layout)
    if layout.overlap_moe_comm:
        check_pairs(schedule, layout.num_stages, layout.schedule)
    with paused_gc():
        ops = _lower(model, layout, chosen, schedule, classes, progress, tables)
    folded = chosen == layout.representatives() and layout.world > len(chosen)
    return Trace(ops, TraceMeta(model=model, layout=layout, world=layout.world,
                                fold=layout if folded else None))


def plan_size(model: ModelSpec, layout: Layout, ranks: Iterable[int] | None = None) -> int:
    """The number of ops `build(model, layout, ranks)` holds, by lowering one rank per
    pipeline coordinate (a rank's ops depend only on it); ConfigError past MAX_PLAN_OPS."""
    chosen = sorted(ranks) if ranks is not None else list(range(layout.world))
    schedule = layout_schedule(layout)
    with paused_gc():
        lowered, _ = _lower_representatives(model, layout, chosen, schedule)
    return sum(len(lowered[first]) * n
               for first, n in _stand_ins(model, layout, chosen).items())


def _lower(model: ModelSpec, layout: Layout, chosen: list[int], schedule: ActionSchedule,
           classes: bool = False, progress: Callable[[int, int], None] | None = None,
           tables: KernelTables | None = None) -> dict[int, tuple[Op, ...]]:
    """Every chosen rank's ops: first one per pipeline coordinate against the budget (the
    plan's size), then the rest."""
    lowered, spent = _lower_representatives(model, layout, chosen, schedule, classes,
                                            progress, tables)
    assert spent == sum(len(lowered[first]) * n
                        for first, n in _stand_ins(model, layout, chosen).items()), \
        "a pass added ops it did not spend"
    for r in chosen:
        if r not in lowered:
            lowered[r] = lower_rank(model, layout, r, schedule[layout.coords(r).pp],
                                    tables=tables)  # (their op rows: `compute._fields`)
            if progress is not None:
                progress(len(lowered), len(chosen))
    return {r: lowered[r] for r in chosen}


def _stand_ins(model: ModelSpec, layout: Layout, chosen: list[int]) -> dict[int, int]:
    """The first chosen rank of each (cp, pp) coordinate and expert load, and how many chosen
    ranks share them."""
    loads: dict[tuple[int, int], object] = {}

    def like(r: int) -> tuple[int, object]:
        at = (layout.coords(r).pp, r % (layout.tp * layout.cp * layout.dp))
        if at not in loads:
            loads[at] = expert_loads(model, layout, r)
        return layout.representative(r), loads[at]

    alike = [like(r) for r in chosen]
    counts = Counter(alike)
    firsts: dict[tuple[int, object], int] = {}
    for r, same in zip(chosen, alike, strict=True):
        firsts.setdefault(same, r)
    return {first: counts[same] for same, first in firsts.items()}


def _lower_representatives(model: ModelSpec, layout: Layout, chosen: list[int],
                           schedule: ActionSchedule, classes: bool = False,
                           progress: Callable[[int, int], None] | None = None,
                           tables: KernelTables | None = None
                           ) -> tuple[dict[int, tuple[Op, ...]], int]:
    """The ops of the first chosen rank per (cp, pp) coordinate, each op spent on the budget
    as many times as chosen ranks share its coordinate (built from their kernel `tables`
    where the op-cap check kept them); and the ops spent (the plan's size)."""
    budget = OpBudget(MAX_PLAN_OPS)
    lowered: dict[int, tuple[Op, ...]] = {}
    stand_ins = _stand_ins(model, layout, chosen)
    try:
        for first, n in stand_ins.items():
            budget.weight = n
            lowered[first] = lower_rank(model, layout, first, schedule[layout.coords(first).pp],
                                        budget, tables)
            if progress is not None:
                progress(len(lowered), len(chosen))
    except OverBudget as spent:
        raise _too_big(max(spent.spent, _compute_size(model, layout, chosen)), layout,
                       chosen, classes) from None
    return lowered, budget.spent


def _compute_size(model: ModelSpec, layout: Layout, chosen: list[int],
                  tables: KernelTables | None = None) -> int:
    """The compute ops alone of every chosen rank, counted without building them; each
    stand-in's kernel table left in `tables` while the count is within MAX_PLAN_OPS (past it
    the plan is refused: none kept, so a refused plan holds at most that many ops' worth)."""
    compute = 0
    for first, n in _stand_ins(model, layout, chosen).items():
        compute += n * count_compute(RankContext(model=model, layout=layout, rank=first),
                                     tables)
        if tables is not None and compute > MAX_PLAN_OPS:
            tables.clear()
            tables = None
    return compute


def _check_compute(model: ModelSpec, layout: Layout, chosen: list[int],
                   classes: bool = False) -> KernelTables:
    """Refuse a plan whose compute ops alone are past MAX_PLAN_OPS, before anything is built;
    else the stand-ins' kernel tables it counted from, for lowering to build from."""
    tables = KernelTables()
    compute = _compute_size(model, layout, chosen, tables)
    if compute > MAX_PLAN_OPS:
        raise _too_big(compute, layout, chosen, classes)
    return tables


def _too_big(ops: int, layout: Layout, chosen: list[int], classes: bool = False) -> ConfigError:
    """The op limit's one line; it suggests folding only where folding would shrink the plan:
    not for ranks that are already one per class of identical ranks (`classes`)."""
    folding = ("" if len(chosen) <= len(layout.representatives()) else
               f"; folded by identity, {len(chosen):,} of the {layout.world:,} ranks still "
               "differ in expert loads, speed or network position" if classes else
               "; or simulate folded, one rank per pipeline stage")
    return ConfigError(f"plan: at least {ops:,} ops for {len(chosen):,} ranks, more than the "
                       f"{MAX_PLAN_OPS:,} parasim builds (fewer micro-batches or "
                       f"layers{folding})")


def lower_rank(model: ModelSpec, layout: Layout, rank: int, actions: list[Action],
               budget: OpBudget | None = None, tables: KernelTables | None = None
               ) -> tuple[Op, ...]:
    """One rank's ops: its schedule actions through every pass, each spending on `budget`
    what it adds (its compute ops from its kernel table in `tables`, where kept)."""
    ctx = RankContext(model=model, layout=layout, rank=rank, budget=budget)
    nodes = lower_compute(ctx, actions, tables)  # spends its ops before building them
    size = _size(nodes)
    for add in (lambda p: add_tensor_parallel(ctx, p),
                lambda p: add_expert_parallel(ctx, p),
                lambda p: add_context_parallel(ctx, p),
                lambda p: add_pipeline_p2p(ctx, actions, p),
                lambda p: add_data_parallel(ctx, actions, p),
                lambda p: add_expert_grads(ctx, actions, p),
                lambda p: add_optimizer(ctx, p, actions),
                lambda p: add_fp8(ctx, actions, p),
                lambda p: overlap_moe_comm(ctx, actions, p),
                lambda p: add_cpu_offload(ctx, actions, p)):
        nodes = add(nodes)
        if budget is not None:
            grown = _size(nodes)
            budget.spend(grown - size)
            size = grown
    return finalize(nodes)


def _size(program: Program) -> int:
    return sum(map(len, program))
