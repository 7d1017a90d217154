"""Benchmark: the DeepSeek-V3-shaped example, balanced and with skewed routing — simulate wall
time, step time and memory, medians of 3 — and the 1 GiB all-to-all on 1,024 to 16,384 H100s.

    python tests/bench/bench_moe.py [--repeat 3] [--skew 1.0] [--global-batch 256]
                                    [--only example|a2a] [--a2a-gpus 1024,2048,8192,16384]

Rows: the shipped example as it is (15,360 sequences, folded: one rank per stage); then the
same model at `--global-batch` sequences balanced and with `routing_skew` = `--skew`, and skewed
at EP 8 (expert-DP 8). Skewed, ranks fold by their experts' loads (`traces.identity`): at the
example's EP 64 every EP rank of a stage has its own load, so all 1,024 are simulated (hence
the smaller batch); at EP 8 the 8 expert-DP replicas of each EP rank fold, 128 are simulated.
Each run is `python -m sim simulate CONFIG --json` as a fresh process; the wall time is the
median of the runs.
The all-to-all rows are `python -m sim collective --cluster dgx-h100 --nodes N/8 --op
all_to_all --sizes 1G --json` (issue 19's target: 8,192 GPUs within 5 s on one core), with
NCCL's choice and time.
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

EXAMPLE = "deepseek-v3-1024-h100.toml"


def variant(folder: Path, name: str, *, skew: float, global_batch: int | None,
            ep: int | None = None) -> Path:
    """The example with `routing_skew`, `global_batch` and `ep` set."""
    lines = []
    for line in example_path(EXAMPLE).read_text().splitlines():
        if global_batch is not None and line.startswith("global_batch"):
            line = f"global_batch = {global_batch}"
        if ep is not None and line.startswith("ep ="):
            line = f"ep = {ep}"
        lines.append(line)
        if line.startswith("dense_layers") and skew:
            lines.append(f"routing_skew = {skew}")
    path = folder / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def one(config: Path) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sim", "simulate", str(config), "--json"],
                          capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, json.loads(proc.stdout)


def all_to_all(gpus: int) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sim", "collective", "--cluster", "dgx-h100",
                           "--nodes", str(gpus // 8), "--op", "all_to_all", "--sizes", "1G",
                           "--json"], capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, json.loads(proc.stdout)["rows"][0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skew", type=float, default=1.0)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--only", choices=("example", "a2a"))
    parser.add_argument("--a2a-gpus", default="1024,2048,8192,16384")
    args = parser.parse_args()
    if args.only != "example":
        print(f"{'all-to-all 1 GiB':<34} {'wall s':>8} {'time ms':>9} {'algo':>11}")
        for gpus in (int(g) for g in args.a2a_gpus.split(",")):
            runs = [all_to_all(gpus) for _ in range(args.repeat)]
            row = runs[-1][1]
            print(f"{f'{gpus:,} H100':<34} {statistics.median(w for w, _ in runs):8.2f} "
                  f"{row['time_s'] * 1e3:9.3f} {row['algo']:>11}", flush=True)
    if args.only == "a2a":
        return
    print(f"{'config':<34} {'wall s':>8} {'step s':>9} {'TFLOP/s':>8} {'MFU':>6} "
          f"{'peak GiB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        configs = {
            "example (15360 seqs)": variant(folder, "full", skew=0, global_batch=None),
            f"balanced ({args.global_batch} seqs)": variant(
                folder, "balanced", skew=0, global_batch=args.global_batch),
            f"skew {args.skew:g} ({args.global_batch} seqs)": variant(
                folder, "skewed", skew=args.skew, global_batch=args.global_batch),
            f"skew {args.skew:g}, ep 8 ({args.global_batch} seqs)": variant(
                folder, "skewed-ep8", skew=args.skew, global_batch=args.global_batch, ep=8),
        }
        for label, config in configs.items():
            runs = [one(config) for _ in range(args.repeat)]
            out = runs[-1][1]
            wall = statistics.median(w for w, _ in runs)
            print(f"{label:<34} {wall:8.2f} {out['step_time_s']:9.3f} "
                  f"{out['model_tflops_per_gpu']:8.1f} {out['mfu']:6.1%} "
                  f"{out['peak_memory_bytes'] / 2**30:9.1f}", flush=True)


if __name__ == "__main__":
    main()
