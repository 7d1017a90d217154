"""Benchmark: `parasim simulate` wall time and peak memory at 1024, 4096 and 16,384 GPUs.

    python tests/bench/bench_simulate.py [--repeat 5]

Each run is a fresh `python -m sim simulate CONFIG --json` process, so the wall time includes
start-up, config loading, plan building, the simulation and the memory model, as a user sees
it; peak RSS is the child's. Prints medians over the runs and the predicted figures.
Targets: GPT-3 175B on 1024 A100 (TP 8 · PP 16 · DP 8) <= 10 s; a 4096-GPU layout <= 60 s.
Every row of issue 23's table (collectives and the search too): `bench_scale.py`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim.config import example_path

CASES = {
    "gpt3-175b 1024 A100 TP8 PP16 DP8 (example)": None,
    "gpt3-175b 4096 A100 TP8 PP16 DP32": {"nodes": 512, "dp": 32, "global_batch": 6144},
    # issue 23's second row: the example's layout on 16,384 GPUs, its global batch kept
    "gpt3-175b 16384 A100 TP8 PP16 DP128": {"nodes": 2048, "dp": 128, "global_batch": 1536},
}


def config_for(change: dict[str, int] | None, folder: Path) -> Path:
    base = example_path()
    if change is None:
        return base
    text = base.read_text()
    text = text.replace("nodes = 128", f"nodes = {change['nodes']}")
    text = text.replace("dp = 8", f"dp = {change['dp']}")
    text = text.replace("global_batch = 1536", f"global_batch = {change['global_batch']}")
    path = folder / "big.toml"
    path.write_text(text)
    return path


CHILD = """
import os, resource, runpy, sys
if os.environ.get("PYTHONPATH") and "" in sys.path:  # the named tree, not the cwd's
    sys.path.remove("")
sys.argv = ["parasim", "simulate", sys.argv[1], "--json"]
try:
    runpy.run_module("sim", run_name="__main__")
except SystemExit:
    pass
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def one(config: Path) -> tuple[float, float, dict]:
    """Wall seconds, peak RSS (MiB) and the --json output of one fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(config)], capture_output=True,
                          text=True, check=True)
    wall = time.perf_counter() - t0
    rss = int(proc.stderr.strip().splitlines()[-1]) / 1024
    return wall, rss, json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, change in CASES.items():
            config = config_for(change, Path(tmp))
            runs = [one(config) for _ in range(args.repeat)]
            wall = statistics.median(r[0] for r in runs)
            rss = statistics.median(r[1] for r in runs)
            out = runs[0][2]
            print(f"{name}: median wall {wall:.2f} s over {args.repeat} runs "
                  f"(min {min(r[0] for r in runs):.2f}, max {max(r[0] for r in runs):.2f}), "
                  f"peak RSS {rss:.0f} MiB")
            print(f"    step {out['step_time_s']:.3f} s, hardware "
                  f"{out['hardware_tflops_per_gpu']:.1f} TFLOP/s/GPU, model "
                  f"{out['model_tflops_per_gpu']:.1f} (MFU {out['mfu']:.1%}), "
                  f"bubble {out['bubble_fraction']:.1%}, exposed comm {out['exposed_comm_s']:.3f}"
                  f" s, peak memory {out['peak_memory_bytes'] / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
