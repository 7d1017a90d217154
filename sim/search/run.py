"""`parasim search`'s two tiers: an analytic screen of every candidate, then the full
discrete-event simulation of the best K.

    from sim.search.problem import problem_from_dict
    from sim.search.run import search
    from sim.search.engines import open_engine
    with open_engine(workers=2) as engine:
        result = search(problem, top_k=16, engine=engine)

1. Screen: every candidate of the space is validated by the layout's own rules and, if valid,
   estimated by `sim.search.analytic` (step time, memory); chunks of candidates run on the
   engine's workers. Invalid candidates are counted by reason, those that do not fit in memory
   under one reason; the rest are ranked by (estimated step time, layout key).
2. Simulate: the best K, plus the seeds' rule-of-thumb layout (`sim.search.rule`) when it is
   not among them, each by `sim.simulate.predict`, the same run `parasim simulate` makes;
   ranked by (simulated step time, layout key). The rule's layout is known before the screen,
   so its simulation is sent right behind the screen's chunks (a worker done with the screen
   runs it while the other ends its chunk); of the rest, the longest are sent first (by
   `sim.search.cost`), so two workers finish together.

Results are identical and identically ordered whatever the engine or worker count: each task
is a pure function of its inputs, and every order is a sort on values with the layout as the
tie-break. The Kendall tau between the analytic and the simulated order of the top K says how
much the simulation changed the ranking.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.search.analytic import Estimate
from sim.search.cost import simulation_cost
from sim.search.engines import Engine, Pending
from sim.search.problem import Problem, context
from sim.search.rule import rule_of_thumb
from sim.search.space import MEMORY_REASON, layout_key, reason_of, validate
from sim.simulate import predict
from traces.errors import ConfigError
from traces.layout import Layout

DEFAULT_TOP = 16
MAX_TOP = 4096
CHUNKS_PER_WORKER = 4
Progress = Callable[[str, int, int, float | None], None]
"""Called with (tier, done, total, best step time so far) as work completes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Screened:
    """One candidate after the screen: a layout and its estimate, or why it was pruned."""

    layout: Layout | None = None
    estimate: Estimate | None = None
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Simulated:
    """The figures `parasim simulate` reports for one layout."""

    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    exposed_comm_s: float
    compute_s: float
    peak_memory_bytes: float
    fits: bool
    cpu_s: float = field(default=0.0, compare=False)
    """CPU seconds the simulation took in its worker (for the timings; not a result)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranked:
    """A feasible candidate: its analytic estimate and rank, and its simulation if it had one."""

    layout: Layout
    estimate: Estimate
    analytic_rank: int
    """1-based, among the candidates that fit; 0 for a layout outside the space."""
    simulated: Simulated | None = None


@dataclass(kw_only=True)
class SearchResult:
    name: str
    cluster: str
    world: int
    memory_capacity_bytes: float
    num_candidates: int
    pruned: dict[str, int]
    """Reason -> candidates, most frequent first; the memory verdict is MEMORY_REASON."""
    feasible: list[Ranked]
    """Every candidate that fits, in analytic order."""
    infeasible: list[tuple[Layout, Estimate]]
    """Valid candidates that do not fit (for the report's memory plot)."""
    top_k: int
    simulated: list[Ranked]
    """The simulated top K, in simulated order."""
    kendall_tau: float | None
    discordant_pairs: int
    rule: Ranked | None
    """The rule of thumb's layout, estimated and simulated (analytic_rank 0: outside the
    space or does not fit)."""
    rule_fits: bool = True
    device: str = "GPU"
    """The cluster's word for a device, as the step report says it ("chip" on a torus)."""
    devices: str = "GPUs"
    examples: dict[str, str] = field(default_factory=dict)
    """Reason -> the first pruned candidate's own message (its numbers; text only)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per tier and worker count: printed, never in the JSON (which must not vary)."""

    @property
    def best(self) -> Ranked:
        return self.simulated[0]


def screen_chunk(problem: Problem,
                 tables: list[dict[str, Any]]) -> tuple[list[Screened], float]:
    """The screen of a chunk of candidates, and the CPU seconds it took (a task: runs in a
    worker)."""
    cpu = time.process_time()
    ctx = context(problem)
    model, cluster = ctx.base.model, ctx.base.cluster
    out = []
    for table in tables:
        try:
            layout = validate(table, model, world=cluster.num_devices,
                              devices_per_server=cluster.devices_per_server)
        except ConfigError as err:
            out.append(Screened(reason=reason_of(err), message=str(err)))
            continue
        out.append(Screened(layout=layout, estimate=ctx.analytic.estimate(layout)))
    return out, time.process_time() - cpu


def simulate_one(problem: Problem, layout: Layout) -> Simulated:
    """The full simulation of one layout (a task: runs in a worker)."""
    cpu = time.process_time()
    s, _ = predict(context(problem).experiment(layout))
    return Simulated(step_time_s=s.step_time_s, tokens_per_s=s.tokens_per_s,
                     model_tflops_per_gpu=s.model_tflops_per_gpu, mfu=s.mfu,
                     bubble_fraction=s.bubble_fraction, exposed_comm_s=s.exposed_comm_s,
                     compute_s=s.compute_s, peak_memory_bytes=s.peak_memory_bytes, fits=s.fits,
                     cpu_s=time.process_time() - cpu)


def search(problem: Problem, *, engine: Engine, top_k: int = DEFAULT_TOP,
           progress: Progress | None = None) -> SearchResult:
    """Screen the whole space, simulate the best `top_k` (see the module docstring)."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP:
        raise ConfigError(f"--top: {top_k!r} must be an integer from 1 to {MAX_TOP:,}")
    started = time.perf_counter()
    ctx = context(problem)  # checks the config and the [search] table here, not in a worker
    tables = list(ctx.space.candidates())
    order, screening = _start_screen(engine, problem, tables)
    if progress is not None:  # the bar from the start of each tier, not its first result
        progress("screen", 0, len(tables), None)
    # The rule's layout does not depend on the screen: its simulation queues behind it, and
    # the first worker done with the screen runs it while the other ends its chunk and this
    # process ranks the candidates.
    rule = rule_of_thumb(ctx)
    early = engine.start(simulate_one, problem, [rule[0]]) if rule else None
    screened, screen_cpu = _screened(screening, order, progress)
    screen_s = time.perf_counter() - started

    pruned: Counter[str] = Counter()
    examples: dict[str, str] = {}
    fits: list[tuple[Layout, Estimate]] = []
    infeasible: list[tuple[Layout, Estimate]] = []
    for s in screened:
        if s.layout is None or s.estimate is None:
            pruned[s.reason] += 1
            examples.setdefault(s.reason, s.message)
        elif s.estimate.fits:
            fits.append((s.layout, s.estimate))
        else:
            pruned[MEMORY_REASON] += 1
            infeasible.append((s.layout, s.estimate))
    _check_some_fit(len(tables), pruned, examples, infeasible, fits, ctx)
    fits.sort(key=lambda c: (c[1].step_time_s, layout_key(c[0])))
    infeasible.sort(key=lambda c: (c[1].step_time_s, layout_key(c[0])))
    feasible = [Ranked(layout=lay, estimate=est, analytic_rank=i + 1)
                for i, (lay, est) in enumerate(fits)]

    top = feasible[:top_k]
    rule_ranked = _place(rule[0], feasible, ctx) if rule else None
    started_des = time.perf_counter()
    runs = _simulate(engine, problem, [r.layout for r in top if not rule or r.layout != rule[0]],
                     ctx, progress, early=(rule[0], early) if rule and early else None)
    simulate_s = time.perf_counter() - started_des
    done = {lay: sim for lay, sim in runs}
    simulated = sorted((_with(r, done[r.layout]) for r in top),
                       key=lambda r: (_des(r), layout_key(r.layout)))
    tau, discordant = kendall_tau([r.estimate.step_time_s for r in simulated],
                                  [_des(r) for r in simulated])
    device, devices = ctx.base.cluster.device_words
    return SearchResult(
        name=ctx.base.name, cluster=ctx.base.cluster.name, world=ctx.base.cluster.num_devices,
        memory_capacity_bytes=ctx.base.cluster.accelerator.memory_bytes,
        num_candidates=len(tables),
        pruned=dict(sorted(pruned.items(), key=lambda kv: (-kv[1], kv[0]))),
        feasible=feasible, infeasible=infeasible, top_k=len(top), simulated=simulated,
        kendall_tau=tau, discordant_pairs=discordant,
        rule=_with(rule_ranked, done[rule_ranked.layout]) if rule_ranked else None,
        rule_fits=bool(rule and rule[1]),
        device=device, devices=devices, examples=examples,
        timings={"screen_s": screen_s, "simulate_s": simulate_s,
                 "wall_s": time.perf_counter() - started, "workers": engine.workers,
                 "screen_cpu_s": screen_cpu,
                 "simulate_cpu_s": sum(sim.cpu_s for _, sim in runs),
                 "simulate_cpu_max_s": max(sim.cpu_s for _, sim in runs)})


def _start_screen(engine: Engine, problem: Problem, tables: list[dict[str, Any]]
                  ) -> tuple[list[int], Pending[tuple[list[Screened], float]]]:
    """Every candidate sent through `screen_chunk`, in contiguous chunks of the affinity
    order (`affinity_order`: neighbours share the analytic model's caches); and that order."""
    order = affinity_order(tables)
    size = max(1, math.ceil(len(tables) / (engine.workers * CHUNKS_PER_WORKER)))
    chunks = [[tables[i] for i in order[at:at + size]] for at in range(0, len(order), size)]
    return order, engine.start(screen_chunk, problem, chunks)


def _screened(screening: Pending[tuple[list[Screened], float]], order: list[int],
              progress: Progress | None) -> tuple[list[Screened], float]:
    """The screen's results in the space's order, and its CPU seconds in all."""
    count, best = 0, math.inf

    def done(_: int, result: tuple[list[Screened], float]) -> None:
        nonlocal count, best
        chunk = result[0]
        count += len(chunk)
        best = min([best, *(s.estimate.step_time_s for s in chunk
                            if s.estimate is not None and s.estimate.fits)])
        if progress is not None:
            progress("screen", count, len(order), best if best < math.inf else None)

    results = screening.wait(done)
    screened: list[Screened] = [Screened()] * len(order)
    for i, s in zip(order, (s for chunk, _ in results for s in chunk), strict=True):
        screened[i] = s
    return screened, sum(cpu for _, cpu in results)


PIPELINE_KEYS = frozenset({"pp", "vp", "schedule", "dp"})
"""Keys the costly parts of an estimate do not depend on: a layer's ops (`PassKey`: the
reduced plan) and their collectives' times are the same whatever the pipeline's depth (dp
follows it), its virtual stages and its schedule."""


def affinity_order(tables: Sequence[dict[str, Any]]) -> list[int]:
    """The candidates' indices, those that differ only in `PIPELINE_KEYS` next to each other
    (groups in the order of their first candidate, the space's order within each): chunks
    cut from it share few cache entries, so workers build fewer of them twice (the space's
    own order runs the pipeline depth slowly: two workers took alternate chunks holding the
    same layers' reduced plans)."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    try:
        for i, table in enumerate(tables):
            key = tuple((k, v) for k, v in table.items() if k not in PIPELINE_KEYS)
            groups.setdefault(key, []).append(i)
    except TypeError:  # a value that cannot be hashed: the space's order
        return list(range(len(tables)))
    return [i for group in groups.values() for i in group]


def _simulate(engine: Engine, problem: Problem, layouts: list[Layout], ctx: Any,
              progress: Progress | None, *,
              early: tuple[Layout, Pending[Simulated]] | None = None
              ) -> list[tuple[Layout, Simulated]]:
    """Simulate `layouts`, the costliest first (`sim.search.cost`; the list's order does not
    matter); with the layout whose simulation was sent `early`, waited for first (it was sent
    first)."""
    order = sorted(layouts, key=lambda lay: (-simulation_cost(ctx.analytic, lay),
                                             layout_key(lay)))
    running = engine.start(simulate_one, problem, order)
    count, best = 0, math.inf
    total = len(order) + (early is not None)
    if progress is not None:
        progress("simulate", 0, total, None)

    def done(_: int, sim: Simulated) -> None:
        nonlocal count, best
        count, best = count + 1, min(best, sim.step_time_s)
        if progress is not None:
            progress("simulate", count, total, best)

    first = [(early[0], early[1].wait(done)[0])] if early is not None else []
    return first + list(zip(order, running.wait(done)))


def _place(layout: Layout, feasible: Sequence[Ranked], ctx: Any) -> Ranked:
    """A layout's estimate and its analytic rank among the feasible ones (0 when it is not
    one of them: outside the space, or too big)."""
    found = next((r for r in feasible if r.layout == layout), None)
    if found is not None:
        return found
    return Ranked(layout=layout, estimate=ctx.analytic.estimate(layout), analytic_rank=0)


def _with(r: Ranked, sim: Simulated) -> Ranked:
    return Ranked(layout=r.layout, estimate=r.estimate, analytic_rank=r.analytic_rank,
                  simulated=sim)


def _des(r: Ranked) -> float:
    assert r.simulated is not None
    return r.simulated.step_time_s


def _check_some_fit(total: int, pruned: Counter[str], examples: dict[str, str],
                    infeasible: list[tuple[Layout, Estimate]],
                    fits: list[tuple[Layout, Estimate]], ctx: Any) -> None:
    """A space with no valid layout, or none that fits, is the user's to fix: one line."""
    if fits:
        return
    if not infeasible:
        reason, count = max(pruned.items(), key=lambda kv: (kv[1], kv[0]))
        raise ConfigError(f"search: none of the {total:,} candidates is a valid layout "
                          f"({count:,} break the rule: {examples[reason]})")
    least = min(est.peak_memory_bytes for _, est in infeasible)
    capacity = ctx.base.cluster.accelerator.memory_bytes
    raise ConfigError(f"search: none of the {len(infeasible):,} valid layouts fits in memory "
                      f"(the smallest peak is {least / 2**30:.1f} GiB per "
                      f"{ctx.base.cluster.device_words[0]}, the "
                      f"accelerator has {capacity / 2**30:.1f} GiB)")


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> tuple[float | None, int]:
    """Kendall's tau-b between two orders of the same items, and how many pairs they order
    differently: 1 when they agree, -1 when one is the other reversed. None under two items.

    tau_b = (C - D) / sqrt((C + D + T_x) (C + D + T_y)), T_x pairs tied only in x."""
    n = len(xs)
    if n < 2:
        return None, 0
    concordant = discordant = tied_x = tied_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = _sign(xs[i] - xs[j]), _sign(ys[i] - ys[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tied_x += 1
            elif dy == 0:
                tied_y += 1
            elif dx == dy:
                concordant += 1
            else:
                discordant += 1
    scale = math.sqrt((concordant + discordant + tied_x) * (concordant + discordant + tied_y))
    return ((concordant - discordant) / scale if scale else 1.0), discordant


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)
