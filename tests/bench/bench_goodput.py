"""Benchmark: `parasim goodput` on the shipped 405B-class run on 16,384 H100s.

    python tests/bench/bench_goodput.py [--repeat 3] [--days 54]

Times the answer (the step's simulation, the plan, the Monte-Carlo of 200 runs), as the median
of `--repeat` runs in this process, with the machine's load average (a shared machine slows
everything). Then the figures next to the run the Llama 3 report describes (Llama Team, "The
Llama 3 Herd of Models", 2024, §3.3.4: 466 interruptions in 54 days of 405B pre-training on
16,384 H100s, 47 planned and 419 unexpected, 148 of them faulty GPUs, 72 HBM3; more than 90%
effective training time). None of parasim's defaults come from that report: this is a check.
The run is compared per 54 days of wall time, as the report counts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from sim.commands.goodput import EXAMPLE
from sim.config import example_path, load_experiment
from sim.goodput.montecarlo import Outcome, check_events, simulate_run
from sim.goodput.plan import GoodputPlan, plan_run, target_tokens
from sim.simulate import predict

LLAMA3 = {"days": 54, "interruptions": 466, "unexpected": 419, "gpu": 148, "hbm": 72,
          "network switch/cable": 35, "effective": 0.90}


def answer(days: float) -> tuple[float, float, float, GoodputPlan, Outcome]:
    """One `parasim goodput` answer, timed in its parts."""
    t0 = time.perf_counter()
    exp = load_experiment(example_path(EXAMPLE))
    summary, _ = predict(exp)
    t1 = time.perf_counter()
    plan = plan_run(exp, summary, target=target_tokens(days, None, summary.tokens_per_s))
    check_events(plan.model, plan.runs, plan.expected_wall_s)
    outcome = simulate_run(plan.model, runs=plan.runs, seed=plan.seed)
    t2 = time.perf_counter()
    return t2 - t0, t1 - t0, t2 - t1, plan, outcome


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--days", type=float, default=54.0)
    args = ap.parse_args()
    times = [answer(args.days) for _ in range(args.repeat)]
    total, step, mc = (statistics.median(t[i] for t in times) for i in range(3))
    plan, o = times[-1][3], times[-1][4]
    print(f"parasim goodput {EXAMPLE} --days {args.days:g}: median of {args.repeat}: "
          f"{total:.2f} s ({step:.2f} s the step, {mc:.2f} s plan + Monte-Carlo of "
          f"{plan.runs} runs); load average {os.getloadavg()[0]:.1f}")
    wall = float(o.wall_times_s.mean())
    per54 = 54 * 86400 / wall
    n = float(o.interruptions.mean())
    print(f"  MTTI {plan.mtti_s / 3600:.2f} h; checkpoint {plan.checkpoint_bytes / 1e12:.2f} "
          "TB "
          f"written in {plan.checkpoint_write_s:.2f} s every {plan.interval_s / 60:.2f} min; "
          f"restart {plan.restart_s / 60:.1f} min")
    print(f"  {'':<32}{'parasim':>10}{'Llama 3':>10}")
    print(f"  {'interruptions per 54 wall days':<32}{n * per54:>10.0f}"
          f"{LLAMA3['unexpected']:>10} unexpected ({LLAMA3['interruptions']} with planned)")
    for cause, key in (("gpu", "gpu"), ("hbm", "hbm"), ("cable", "network switch/cable")):
        print(f"  {'  ' + cause:<32}{o.by_cause.get(cause, 0.0) * per54:>10.0f}"
              f"{LLAMA3[key]:>10}")
    print(f"  {'  switch':<32}{o.by_cause.get('switch', 0.0) * per54:>10.0f}")
    print(f"  {'effective training fraction':<32}{o.effective_fraction:>10.1%}"
          f"{'> 90%':>10}")
    print(f"  {'MTTI (h)':<32}{plan.mtti_s / 3600:>10.2f}"
          f"{LLAMA3['days'] * 24 / LLAMA3['unexpected']:>10.2f} (54 d x 24 h / 419)")


if __name__ == "__main__":
    main()
