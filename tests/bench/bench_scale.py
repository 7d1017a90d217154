"""Benchmark: the rows of issue 23's table, each a fresh `python -m sim ...` process.

    python tests/bench/bench_scale.py [--repeat 5] [--timeout 300] [--only all-to-all]
    PYTHONPATH=/other/checkout python tests/bench/bench_scale.py    # another tree's code

Each row runs its command `--repeat` times (3 for the largest rows) and prints the median
wall time (start-up included, as a user sees it), the spread and the child's peak RSS; a
command refused by a bound (exit 2) prints its one-line message instead, and one that runs
past `--timeout` is killed once and reported as such (the next repeats are skipped). The
children import whatever `PYTHONPATH` names, so the same script measures before and after.
On a machine shared with other work the figures are noisy: compare ratios measured back to
back.
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

EXAMPLE = str(example_path())
LARGEST = 3
"""Repeats of the rows marked large (a minute or more each before issue 23)."""

ROWS: list[tuple[str, list[str], bool]] = [
    ("GPT-3 175B / 1024 A100 step (example, folded)", ["simulate", EXAMPLE, "--json"], False),
    ("same layout, 16,384 GPUs (DP 128)", ["simulate", "{big}", "--json"], False),
    ("GPT-3 175B, TP 8 x PP 16 x DP 1024 (131,072 GPUs, batch 16,384)",
     ["simulate", "{huge}", "--json"], True),
    ("same, unfolded (every rank)", ["simulate", EXAMPLE, "--json", "--no-fold"], False),
    ("all-reduce 1 GiB, 65,536 H100", ["collective", "--cluster", "dgx-h100", "--nodes", "8192",
                                       "--op", "all_reduce", "--sizes", "1G", "--json"], True),
    ("all-reduce 1 GiB, 131,072 H100", ["collective", "--cluster", "dgx-h100", "--nodes",
                                        "16384", "--op", "all_reduce", "--sizes", "1G",
                                        "--json"], True),
    *[(f"all-to-all 1 GiB, {n} H100", ["collective", "--cluster", "dgx-h100", "--nodes",
                                       str(n // 8), "--op", "all_to_all", "--sizes", "1G",
                                       "--json"], n >= 2048)
      for n in (512, 1024, 2048, 8192, 16384)],
    ("search GPT-3 / 1024 GPUs, top 16 verified, 2 workers",
     ["search", "--json", "--workers", "2"], True),
]

CHILD = """
import os, resource, runpy, sys
if os.environ.get("PYTHONPATH") and "" in sys.path:  # the named tree, not the cwd's
    sys.path.remove("")
sys.argv = ["parasim", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("sim", run_name="__main__")
except SystemExit as exit:
    code = exit.code if isinstance(exit.code, int) else 1
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def huge_config(folder: Path) -> str:
    """The example at DP 1024 (16,384 nodes, 131,072 GPUs), global batch 16,384."""
    text = Path(EXAMPLE).read_text().replace("nodes = 128", "nodes = 16384")
    text = text.replace("dp = 8", "dp = 1024").replace("global_batch = 1536",
                                                      "global_batch = 16384")
    path = folder / "gpt3-131072.toml"
    path.write_text(text)
    return str(path)


def big_config(folder: Path) -> str:
    """The example at DP 128 (2048 nodes), its global batch kept."""
    text = Path(EXAMPLE).read_text().replace("nodes = 128", "nodes = 2048")
    path = folder / "gpt3-16384.toml"
    path.write_text(text.replace("dp = 8", "dp = 128"))
    return str(path)


def one(args: list[str], timeout: float) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB, children included) and what to show: a figure of the
    output, the refusal, or 'killed'."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, float("nan"), f"killed at {timeout:.0f} s"
    wall = time.perf_counter() - t0
    lines = proc.stderr.strip().splitlines()
    rss = int(lines[-1]) / 1024 if lines and lines[-1].isdigit() else float("nan")
    if proc.returncode:
        return wall, rss, "refused: " + (lines[-2] if len(lines) > 1 else "?")[:150]
    out = json.loads(proc.stdout)
    if "step_time_s" in out:
        return wall, rss, f"step {out['step_time_s']:.4f} s"
    if "rows" in out:
        return wall, rss, f"{out['rows'][0]['algo']} {out['rows'][0]['time_s'] * 1e3:.3f} ms"
    simulated = out.get("simulated")
    return wall, rss, f"{len(simulated) if isinstance(simulated, list) else simulated} simulated"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--only", help="rows whose name contains this")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big, huge = big_config(Path(tmp)), huge_config(Path(tmp))
        for name, command, large in ROWS:
            if args.only and args.only not in name:
                continue
            command = [{"{big}": big, "{huge}": huge}.get(c, c) for c in command]
            runs = []
            for _ in range(min(args.repeat, LARGEST) if large else args.repeat):
                runs.append(one(command, args.timeout))
                if runs[-1][2].startswith(("killed", "refused")):
                    break
            walls = [r[0] for r in runs]
            print(f"{name}: median {statistics.median(walls):.2f} s over {len(runs)} "
                  f"(min {min(walls):.2f}, max {max(walls):.2f}), peak RSS "
                  f"{statistics.median(r[1] for r in runs):.0f} MiB; {runs[0][2]}", flush=True)


if __name__ == "__main__":
    main()
