"""`parasim search --objective goodput`: the simulated layouts ranked by effective tokens per
second over a whole run, beside their step-time ranking.

For each simulated layout: its step time and tokens/s (the simulation's), its checkpoint from
its own per-rank memory (`sim.models.memory`), and the config's `[reliability]` settings give
the expected effective training fraction at Daly's optimal interval (`sim.goodput`); effective
tokens/s = tokens/s x that fraction. A layout whose checkpoint is smaller or cheaper to write
can win over a slightly faster step. The analytic expectation ranks (no Monte-Carlo per
layout): it is what the Monte-Carlo converges to.

Beside the ranking, each layout's time to train one common target (the tokens the fastest
simulated layout trains in RUN_DAYS without failures) as `parasim goodput` gives it: P50 and
P90 days and GPU-hours over the config's seeded Monte-Carlo runs (`sim.goodput.outputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sim.goodput.montecarlo import check_events, simulate_run
from sim.goodput.outputs import TimeToTrain, time_to_train
from sim.goodput.plan import DAY_S, plan_from
from sim.models.memory import memory_by_pp_rank
from sim.search.problem import Context
from sim.search.run import Ranked, SearchResult
from sim.search.space import describe, layout_key
from traces.pipeline import layout_schedule

OBJECTIVES = ("step_time", "goodput")
RUN_DAYS = 30.0
"""The run the ranking assumes: 30 days of failure-free training (the last checkpoint
segment barely moves the fraction)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputRow:
    candidate: Ranked
    step_rank: int
    """1-based, in the search's simulated (step-time) order."""
    effective_tokens_per_s: float
    effective_fraction: float
    mtti_s: float
    checkpoint_write_s: float
    interval_s: float
    time_to_train: TimeToTrain
    """To the common target (module docstring)."""


def rank_by_goodput(result: SearchResult, ctx: Context) -> list[GoodputRow]:
    """The simulated top K (the rule of thumb is left out), best goodput first."""
    base = ctx.base
    rows = []
    common = RUN_DAYS * DAY_S * max((c.simulated.tokens_per_s for c in result.simulated
                                     if c.simulated is not None), default=0.0)
    for i, c in enumerate(result.simulated):
        assert c.simulated is not None
        exp = replace(ctx.experiment(c.layout), reliability=base.reliability)
        memory = memory_by_pp_rank(base.model, c.layout, layout_schedule(c.layout),
                                   base.cluster.devices_per_server,
                                   base.cluster.accelerator.fp8_block_scaling)
        plan = plan_from(exp, step_time_s=c.simulated.step_time_s,
                         tokens_per_s=c.simulated.tokens_per_s, memory=memory,
                         target=RUN_DAYS * DAY_S * c.simulated.tokens_per_s)
        to_common = plan_from(exp, step_time_s=c.simulated.step_time_s,
                              tokens_per_s=c.simulated.tokens_per_s, memory=memory,
                              target=common)
        check_events(to_common.model, to_common.runs, to_common.expected_wall_s)
        outcome = simulate_run(to_common.model, runs=to_common.runs, seed=to_common.seed)
        rows.append(GoodputRow(candidate=c, step_rank=i + 1,
                               effective_tokens_per_s=c.simulated.tokens_per_s
                               * plan.fraction_at_optimum,
                               effective_fraction=plan.fraction_at_optimum,
                               mtti_s=plan.mtti_s, checkpoint_write_s=plan.checkpoint_write_s,
                               interval_s=plan.interval_s,
                               time_to_train=time_to_train(to_common, outcome)))
    return sorted(rows, key=lambda r: (-r.effective_tokens_per_s,
                                       layout_key(r.candidate.layout)))


def goodput_json(rows: list[GoodputRow]) -> dict[str, Any]:
    """The keys `--objective goodput` adds to the search's JSON."""
    return {"objective": "goodput", "goodput": [
        {"rank": i + 1, "layout": r.candidate.layout.to_dict(),
         "summary": describe(r.candidate.layout), "step_rank": r.step_rank,
         "effective_tokens_per_s": r.effective_tokens_per_s,
         "effective_training_fraction": r.effective_fraction,
         "mtti_s": r.mtti_s, "checkpoint_write_s": r.checkpoint_write_s,
         "checkpoint_interval_s": r.interval_s,
         "time_to_train": {"tokens": r.time_to_train.tokens,
                           "days": {"p50": r.time_to_train.p50_days,
                                    "p90": r.time_to_train.p90_days},
                           "gpu_hours": {"p50": r.time_to_train.p50_gpu_hours,
                                         "p90": r.time_to_train.p90_gpu_hours}}}
        for i, r in enumerate(rows)]}


def goodput_text(rows: list[GoodputRow]) -> str:
    """The table `--objective goodput` adds to the search's text."""
    width = max([len("layout"), *(len(describe(r.candidate.layout)) for r in rows)])
    lines = ["", "", f"  ranked by goodput over a {RUN_DAYS:g}-day run (Daly's interval, the "
             "config's [reliability]):",
             f"  {'#':>3}  {'layout':<{width}} {'eff. tokens/s':>13} {'fraction':>8} "
             f"{'write s':>8} {'step #':>6} {'p50 d':>8} {'p90 d':>8} {'p50 GPU-h':>12} "
             f"{'p90 GPU-h':>12}"]
    for i, r in enumerate(rows):
        t = r.time_to_train
        lines.append(f"  {i + 1:>3}  {describe(r.candidate.layout):<{width}} "
                     f"{r.effective_tokens_per_s:>13,.0f} {r.effective_fraction:>8.2%} "
                     f"{r.checkpoint_write_s:>8.3g} {r.step_rank:>6} {t.p50_days:>8,.2f} "
                     f"{t.p90_days:>8,.2f} {t.p50_gpu_hours:>12,.0f} {t.p90_gpu_hours:>12,.0f}")
    if rows:
        lines.append(f"  time to train {rows[0].time_to_train.tokens:.4g} tokens (the fastest "
                     f"layout's {RUN_DAYS:g} failure-free days): P50/P90 over the Monte-Carlo")
    return "\n".join(lines)
