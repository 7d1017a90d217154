"""Benchmark: `parasim search` on GPT-3 175B and 1024 A100s (the shipped search example).

    python tests/bench/bench_search.py [--workers 1,2] [--top 16]

For each worker count, one whole search (screen of every candidate, simulation of the top K
and of the rule of thumb), timed: the space, the analytic screen and the simulations (wall and
CPU seconds, and the longest simulation, which bounds any speed-up), the wall time, the speed-up
over one worker and the machine's load average (on a shared machine other work takes cores);
that the
JSON is the same whatever the worker count; the Kendall tau between the analytic and the
simulated order. Then the best layout next to Megatron-LM's for this model and size
(Narayanan et al. 2021, Table 1: TP 8, PP 16, DP 8, micro-batch 1, batch 1536, full
recomputation; 138 TFLOP/s per GPU measured) and the seeds' rule of thumb, each simulated.
Target: the whole search under 2 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from sim.commands.search import EXAMPLE
from sim.config import example_path, load_experiment
from sim.search.engines import open_engine
from sim.search.output import result_json
from sim.search.problem import problem_from_dict
from sim.search.run import Ranked, SearchResult, search, simulate_one
from sim.search.space import describe
from sim.simulate import predict
from traces.files import load_toml
from traces.layout import Layout

MEGATRON_TFLOPS = 138  # per GPU, hardware FLOPs (recomputation included), Narayanan et al. 2021


def timed_search(workers: int, top: int) -> tuple[SearchResult, float, float]:
    """A whole search from a cold engine: the result, its wall seconds, and the machine's
    1-minute load average after it (other work on the machine slows it)."""
    problem = problem_from_dict(load_toml(example_path(EXAMPLE)), name="gpt3-search")
    wall = time.perf_counter()
    with open_engine(workers=workers) as engine:
        result = search(problem, engine=engine, top_k=top)
    return result, time.perf_counter() - wall, os.getloadavg()[0]


def row(name: str, layout: Layout, step: float, tokens: float, tflops: float, mfu: float,
        rank: str) -> str:
    return (f"  {name:<26} {describe(layout):<50} {step:8.3f} {tokens:10,.0f} {tflops:7.1f} "
            f"{mfu:6.1%}  {rank}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="worker counts to time (default 1,2)")
    parser.add_argument("--top", type=int, default=16)
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    runs = {w: timed_search(w, args.top) for w in counts}
    result = runs[counts[0]][0]
    valid = len(result.feasible) + len(result.infeasible)
    print(f"GPT-3 175B on 1024 A100s, global batch 1536: {result.num_candidates:,} candidates, "
          f"{valid:,} valid layouts, {len(result.feasible):,} fit in 80 GiB")
    print(f"  {'workers':>7} {'screen s':>9} {'(CPU s)':>8} {'simulate s':>11} {'(CPU s)':>8} "
          f"{'(longest)':>9} {'wall s':>7} {'speed-up':>8} {'load':>5}")
    base_wall = runs[counts[0]][1]
    for w, (r, wall, load) in runs.items():
        t = r.timings
        print(f"  {w:>7} {t['screen_s']:9.1f} {t['screen_cpu_s']:8.1f} {t['simulate_s']:11.1f} "
              f"{t['simulate_cpu_s']:8.1f} {t['simulate_cpu_max_s']:9.1f} {wall:7.1f} "
              f"{base_wall / wall:8.2f} {load:5.1f}")
    outputs = {json.dumps(result_json(r)) for r, _, _ in runs.values()}
    print(f"  JSON identical across worker counts: {len(outputs) == 1}")
    pairs = result.top_k * (result.top_k - 1) // 2
    print(f"  Kendall tau over the top {result.top_k}: {result.kendall_tau:.3f} "
          f"({result.discordant_pairs} of {pairs} pairs swapped)")
    print()
    compare(result)


def compare(result: SearchResult) -> None:
    """The best, Megatron-LM's layout (as published, and under the search's fixed keys) and
    the rule of thumb, simulated."""
    print(f"  {'':<26} {'layout':<50} {'step s':>8} {'tokens/s':>10} {'TFLOP/s':>7} "
          f"{'MFU':>6}  analytic rank")
    best = result.best
    assert best.simulated is not None
    s = best.simulated
    print(row("best found", best.layout, s.step_time_s, s.tokens_per_s,
              s.model_tflops_per_gpu, s.mfu, f"{best.analytic_rank}"))
    published = load_experiment(example_path())
    summary, _ = predict(published)
    print(row("Megatron-LM (as run, 2021)", published.layout, summary.step_time_s,
              summary.tokens_per_s, summary.model_tflops_per_gpu, summary.mfu,
              f"- (overlap_grad_reduce off; {summary.hardware_tflops_per_gpu:.0f} hardware "
              f"TFLOP/s/GPU vs {MEGATRON_TFLOPS} measured)"))
    fixed = Layout(**{**published.layout.to_dict(), "overlap_grad_reduce": True})
    in_space = next((c for c in result.feasible if c.layout == fixed), None)
    if in_space is not None:
        problem = problem_from_dict(load_toml(example_path(EXAMPLE)), name="gpt3-search")
        sim = simulate_one(problem, fixed)
        print(row("Megatron-LM layout", fixed, sim.step_time_s, sim.tokens_per_s,
                  sim.model_tflops_per_gpu, sim.mfu,
                  f"{in_space.analytic_rank} of {len(result.feasible)}"))
    rule: Ranked | None = result.rule
    if rule is not None and rule.simulated is not None:
        r = rule.simulated
        print(row("rule of thumb (seeds)", rule.layout, r.step_time_s, r.tokens_per_s,
                  r.model_tflops_per_gpu, r.mfu,
                  f"{rule.analytic_rank or 'outside the space'} of {len(result.feasible)}"))


if __name__ == "__main__":
    main()
