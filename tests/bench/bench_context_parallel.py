"""Benchmark: the two context-parallel Llama 3 examples — simulate wall time and predictions.

    python tests/bench/bench_context_parallel.py [--repeat 5]

For `llama3-70b-h100.toml` (TP 4 · CP 2 · PP 4 · VP 5 · DP 2 at 8K tokens) and
`llama3-8b-128k-h100.toml` (TP 4 · CP 8 all-gather · PP 2 at 128K), each in both CP modes:
`python -m sim simulate CONFIG --json` as fresh processes, the median wall time of the runs,
and the predicted step time, model TFLOP/s per GPU, MFU and peak memory. The examples use the
Llama-style [model] keys (kv_heads, ffn, norm, position, bias) of issue 18's model options.
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

EXAMPLES = ("llama3-70b-h100.toml", "llama3-8b-128k-h100.toml")
MODES = ("p2p", "all_gather")


def variant(name: str, mode: str, folder: Path) -> Path:
    """The example with `cp_comm` set to `mode`."""
    text = example_path(name).read_text()
    lines = [f'cp_comm = "{mode}"' if line.startswith("cp_comm") else line
             for line in text.splitlines()]
    path = folder / f"{mode}-{name}"
    path.write_text("\n".join(lines) + "\n")
    return path


def one(config: Path) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sim", "simulate", str(config), "--json"],
                          capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'config':<40} {'wall s':>8} {'step s':>9} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in EXAMPLES:
            for mode in MODES:
                config = variant(name, mode, Path(tmp))
                runs = [one(config) for _ in range(args.repeat)]
                out = runs[-1][1]
                wall = statistics.median(w for w, _ in runs)
                print(f"{name.removesuffix('.toml') + ' ' + mode:<40} {wall:8.2f} "
                      f"{out['step_time_s']:9.3f} {out['model_tflops_per_gpu']:8.1f} "
                      f"{out['mfu']:6.1%} {out['peak_memory_bytes'] / 2**30:9.1f}")


if __name__ == "__main__":
    main()
