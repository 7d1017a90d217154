"""Benchmark: how long the shipped DeepSeek-V3 examples take to simulate (issue 33, item 5).

    python tests/bench/bench_moe_speed.py [--repeat 3] [--only TEXT]

Each run is a fresh `python -m sim simulate CONFIG --json` process on one core (wall time:
start-up, config, plan, replay, memory model, as a user sees it; and its CPU seconds, user +
system, which a loaded host changes less). Prints the medians over the runs, or the one-line
refusal where parasim refuses the case (the op cap). Targets: the
1024-H100 example <= 10 s balanced, <= 30 s with `model.routing_skew = 1`. `--only` runs the
cases whose name holds the text.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "sim" / "examples"
CASES = {
    "deepseek-v3 1024 H100 (example, balanced)": ("deepseek-v3-1024-h100.toml", []),
    "deepseek-v3 1024 H100 routing_skew = 1": ("deepseek-v3-1024-h100.toml",
                                               ["--set", "model.routing_skew=1"]),
    "deepseek-v3 2048 H800 dualpipe (example)": ("deepseek-v3-2048-h800.toml", []),
    # the skewed case at 16 micro-batches, not 240: under the op cap, so the replay of 1,024
    # ranks that all differ is timed while the full case is refused
    "deepseek-v3 1024 H100 skew 1, global batch 1024": (
        "deepseek-v3-1024-h100.toml",
        ["--set", "model.routing_skew=1", "--set", "parallel.global_batch=1024"]),
}


def run_once(config: str, extra: list[str]) -> tuple[float, float, str | None]:
    """(wall seconds, CPU seconds, the refusal's line or None) of one simulate process."""
    command = [sys.executable, "-m", "sim", "simulate", str(EXAMPLES / config), "--json", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode == 2:
        return wall, cpu, done.stderr.strip().splitlines()[-1]
    done.check_returncode()
    return wall, cpu, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="run the cases whose name holds this")
    args = parser.parse_args()
    for name, (config, extra) in CASES.items():
        if args.only not in name:
            continue
        runs = [run_once(config, extra) for _ in range(args.repeat)]
        refusal = runs[0][2]
        wall = statistics.median(run[0] for run in runs)
        cpu = statistics.median(run[1] for run in runs)
        took = f"{wall:.1f} s wall, {cpu:.2f} s CPU"
        result = f"refused in {took}: {refusal}" if refusal else took
        print(f"{name:45s} median of {args.repeat}: {result}", flush=True)


if __name__ == "__main__":
    main()
