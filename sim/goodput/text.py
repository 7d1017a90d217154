"""What `parasim goodput` prints without --json: the run, its failures, its checkpoints."""

from __future__ import annotations

import numpy as np

from sim.goodput.montecarlo import Outcome
from sim.goodput.outputs import CHECKPOINT_STALLS, lost_gpu_hours, time_to_train
from sim.goodput.plan import GoodputPlan
from sim.goodput.rates import Component

DAY_S = 86_400.0
RECOVERY_TEXT = {
    "in_memory": "in_memory: checkpoints to a peer node's memory, restarts load from it "
                 "(GEMINI, SOSP 2023)",
    "elastic": "elastic: in-memory checkpoints, in-place restart on warm standbys, no "
               "requeue or repair wait (ByteRobust, SOSP 2025)"}
INDENT = "\n" + " " * 22


def _duration(seconds: float) -> str:
    if seconds >= 2 * DAY_S:
        return f"{seconds / DAY_S:.2f} d"
    if seconds >= 7200:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


def _no_spares(p: GoodputPlan) -> list[str]:
    """A line saying what running without spares costs, when that is the run's choice."""
    hardware = sum(c.rate_per_s for c in p.model.causes if c.hardware)
    if p.reliability.spare_nodes or not hardware:
        return []
    repair = p.restart.repair_s
    share = hardware * repair  # waits per wall second
    return [f"  spares              none: each hardware failure waits {_duration(repair)}"
            f" for its repair, about {share:.1%} of the wall time;{INDENT}fleets at this scale "
            "keep spare nodes ([reliability] spare_nodes)"]


def goodput_text(p: GoodputPlan, o: Outcome) -> str:
    r = p.restart
    low, high = o.fraction_interval()
    p10, p50, p90 = np.percentile(o.wall_times_s, [10, 50, 90]).tolist()
    where = (f"set by [reliability] mtti, split as fleet {p.fleet}" if p.mtti_given else
             f"fleet {p.fleet}: " + ", ".join(f"{p.counts[c]:,} {c}" for c in Component
                                 if p.rates_per_hour[c] > 0 and p.counts[c]))
    lines = [
        f"parasim goodput: {p.name} on {p.cluster} ({p.world:,} devices, {p.nodes:,} nodes)",
        f"  step                {p.step_time_s:.4g} s, {p.tokens_per_s:,.0f} tokens/s"
        + (f" (per-rank variability adds {p.variability_s:.3g} s)" if p.variability_s else ""),
        f"  target              {p.target_tokens:.4g} tokens = "
        f"{_duration(p.model.useful_s)} of failure-free compute",
        f"  MTTI                {_duration(p.mtti_s)} ({where})" if p.mtti_s < float("inf") else
        "  MTTI                none: every failure rate is 0",
        f"  checkpoint          {p.checkpoint_bytes / 1e12:.3g} TB, write "
        f"{_duration(p.checkpoint_write_s)}"
        + (f", asynchronous: training stalls {_duration(p.stall_s)}"
           if p.reliability.async_checkpoint else ""),
        f"  restart             {_duration(p.restart_s)} on average"
        + ("  (set by [reliability] restart)" if r.fixed_s is not None else
           f"{INDENT}(detection {_duration(r.detection_s)}, requeue {_duration(r.requeue_s)}, "
           f"process groups {_duration(r.pg_init_s)}, load {_duration(r.load_s)}, "
           f"warm-up {_duration(r.warmup_s)};{INDENT}repair {_duration(r.repair_s)} without "
           f"a spare, {p.reliability.spare_nodes} spare nodes"
           f"{' (default)' if p.spares_default else ''})"),
        *_no_spares(p),
        *([f"  recovery            {RECOVERY_TEXT[p.reliability.recovery]}"]
          if p.reliability.recovery != "restart" else []),
        f"  interval            {_duration(p.interval_s)}"
        + (" (set by [reliability])" if p.interval_given else " (Daly's optimum)")
        + f"; Daly {_duration(p.daly_s)}, Young {_duration(p.young_s)}",
        f"  effective fraction  {o.effective_fraction:.2%} simulated (95% CI {low:.2%} to "
        f"{high:.2%}, {len(o.wall_times_s)} runs, seed {p.seed}); analytic "
        f"{p.fraction_at_interval:.2%} at this interval, {p.fraction_at_optimum:.2%} at "
        "the optimum",
        f"  wall time           p10 {_duration(p10)}, p50 {_duration(p50)}, p90 "
        f"{_duration(p90)} (analytic mean {_duration(p.expected_wall_s)})",
        _time_to_train(p, o),
        *_stragglers(p),
        f"  interruptions       {float(np.mean(o.interruptions)):,.1f} on average",
        "  by cause            interruptions   lost GPU-hours",
    ]
    for name, lost in lost_gpu_hours(p, o).items():
        count = f"{o.by_cause[name]:,.1f}" if name != CHECKPOINT_STALLS else ""
        lines.append(f"    {name:<18}{count:>13}   {lost:>14,.0f}")
    lines.append("  badput (ml-goodput-measurement's categories), hours per run:")
    lines += [f"    {name:<40}{seconds / 3600:>10,.2f}" for name, seconds in o.badput_s.items()
              if seconds > 0]
    return "\n".join(lines)


def _stragglers(p: GoodputPlan) -> list[str]:
    s = p.stragglers
    if s is None:
        return []
    verdict = (f"evicting them (one {_duration(s.evict_s)} restart) saves "
               f"{_duration(s.saved_s)}" if s.evict else
               f"evicting them costs more (one {_duration(s.evict_s)} restart)")
    return [f"  stragglers          {s.slow_nodes_expected:,.1f} slow nodes expected: "
            f"+{s.slow_step_s:.3g} s a step, {_duration(s.keep_s)} ({s.keep_gpu_hours:,.0f} "
            f"GPU-hours) over the run;{INDENT}{verdict}"]


def _time_to_train(p: GoodputPlan, o: Outcome) -> str:
    t = time_to_train(p, o)
    return (f"  time to train       {t.tokens:.4g} tokens: p50 {t.p50_days:,.2f} d, p90 "
            f"{t.p90_days:,.2f} d;{INDENT}p50 {t.p50_gpu_hours:,.0f} GPU-hours, p90 "
            f"{t.p90_gpu_hours:,.0f} GPU-hours")
