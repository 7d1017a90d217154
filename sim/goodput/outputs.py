"""What `parasim goodput --json` prints: every figure the text shows, and the badput by
ml-goodput-measurement's categories (`sim.goodput.badput`), so a prediction can be held
against a live run's measurement.

Time-to-train is the planner's answer: the wall time of each Monte-Carlo run to the token
target (the step time is the simulated one, the expected stretch of the cluster's per-rank
variability included, `step_variability_s`), as its P50 and P90 in days and in GPU-hours
(wall time x the job's GPUs). No value is infinite: with no failure rate the MTTI and the
intervals are null, and the reason says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.goodput.montecarlo import Outcome
from sim.goodput.plan import GoodputPlan
from sim.goodput.rates import Component

DAY_S = 86_400.0
NO_FAILURES = "every failure rate is 0: no interruption, one checkpoint at the end"
CHECKPOINT_STALLS = "checkpoint stalls"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeToTrain:
    """P50 and P90 over the runs of the wall time to the target, in days and GPU-hours."""

    tokens: float
    p50_days: float
    p90_days: float
    p50_gpu_hours: float
    p90_gpu_hours: float


def time_to_train(p: GoodputPlan, o: Outcome) -> TimeToTrain:
    """The runs' wall times to `p.target_tokens` as P50/P90 (numpy's linear percentiles)."""
    p50, p90 = np.percentile(o.wall_times_s, [50, 90]).tolist()
    return TimeToTrain(tokens=p.target_tokens, p50_days=p50 / DAY_S, p90_days=p90 / DAY_S,
                       p50_gpu_hours=p50 * p.world / 3600, p90_gpu_hours=p90 * p.world / 3600)


def lost_gpu_hours(p: GoodputPlan, o: Outcome) -> dict[str, float]:
    """Mean GPU-hours lost per run by cause, checkpoint stalls last (the text's table)."""
    rows = sorted(((k, v) for k, v in o.by_cause.items()), key=lambda kv: -kv[1])
    out = {name: o.lost_s_by_cause[name] * p.world / 3600 for name, _ in rows}
    out[CHECKPOINT_STALLS] = o.lost_s_by_cause["checkpoint"] * p.world / 3600
    return out


def goodput_json(p: GoodputPlan, o: Outcome) -> dict[str, Any]:
    """The `--json` object (provenance is merged by the command)."""
    p10, p50, p90 = np.percentile(o.wall_times_s, [10, 50, 90]).tolist()
    low, high = o.fraction_interval()
    finite = math.isfinite(p.mtti_s)
    r = p.restart
    ttt = time_to_train(p, o)
    return {
        "seed": p.seed, "runs": len(o.wall_times_s),
        "step_time_s": p.step_time_s, "step_variability_s": p.variability_s,
        "tokens_per_s": p.tokens_per_s,
        "target_tokens": p.target_tokens, "useful_compute_s": p.model.useful_s,
        "mtti_s": p.mtti_s if finite else None,
        **({} if finite else {"mtti_null_reason": NO_FAILURES}),
        "mtti_given": p.mtti_given, "fleet": p.fleet,
        "components": {str(c): p.counts[c] for c in Component
                       if p.rates_per_hour[c] > 0 and p.counts[c]},
        "checkpoint_bytes": p.checkpoint_bytes, "checkpoint_write_s": p.checkpoint_write_s,
        "async_checkpoint": p.reliability.async_checkpoint,
        "checkpoint_stall_s": p.stall_s,
        "restart_s": p.restart_s,
        "restart_parts_s": ({"fixed": r.fixed_s} if r.fixed_s is not None else
                            {"detection": r.detection_s, "requeue": r.requeue_s,
                             "process_groups": r.pg_init_s, "load": r.load_s,
                             "warmup": r.warmup_s, "repair": r.repair_s}),
        "spare_nodes": p.reliability.spare_nodes, "spare_nodes_default": p.spares_default,
        "recovery": p.reliability.recovery,
        "checkpoint_interval_s": p.interval_s, "checkpoint_interval_given": p.interval_given,
        "daly_interval_s": p.daly_s if finite else None,
        "young_interval_s": p.young_s if finite else None,
        "effective_training_fraction": o.effective_fraction,
        "effective_training_fraction_ci95": [low, high],
        "analytic_fraction_at_interval": p.fraction_at_interval,
        "analytic_fraction_at_optimum": p.fraction_at_optimum,
        "wall_time_s": {"p10": p10, "p50": p50, "p90": p90},
        "expected_wall_s": p.expected_wall_s,
        "time_to_train": {"tokens": ttt.tokens,
                          "days": {"p50": ttt.p50_days, "p90": ttt.p90_days},
                          "gpu_hours": {"p50": ttt.p50_gpu_hours, "p90": ttt.p90_gpu_hours}},
        "interruptions": float(np.mean(o.interruptions)),
        "interruptions_by_cause": o.by_cause,
        "lost_gpu_hours_by_cause": lost_gpu_hours(p, o),
        "stragglers": _stragglers(p),
        "goodput_s": o.useful_s,
        "badput_s": o.badput_s,
    }


def _stragglers(p: GoodputPlan) -> dict[str, Any] | None:
    s = p.stragglers
    if s is None:
        return None
    return {"slow_nodes_expected": s.slow_nodes_expected, "slow_step_s": s.slow_step_s,
            "steps": s.steps, "keep_s": s.keep_s, "keep_gpu_hours": s.keep_gpu_hours,
            "evict_s": s.evict_s, "evict": s.evict, "evict_saves_s": s.saved_s}
