"""Benchmark: how long the shipped DeepSeek-V3 examples take to simulate (issue 33, item 5).

    python tests/bench/bench_moe_speed.py [--repeat 3] [--only TEXT]

Each run is a fresh `python -m sim simulate CONFIG --json` process on one core (wall time:
start-up, config, plan, replay, memory model, as a user sees it; and its CPU seconds, user +
system, which a loaded host changes less). Prints the medians over the runs, or the one-line
refusal where parasim refuses the case (the op cap). Targets: the
1024-H100 example <= 10 s balanced, <= 30 s with `model.routing_skew = 1`. `--only` runs the
cases whose name holds the text. `--phases` prints instead, per case, the median process seconds
of each phase (import, config, partition, plan, durations, lowering, steps, loop, memory,
summary, output: `simulate_phases.py`), each run a fresh process too.

The MoE Parallel Folding paper's Table 5 rows (context parallelism with MoE,
`moe_rows_folding.py`, as `bench_moe_recipes.py --table folding-t5` simulates them) are timed
the same way, each row's experiment written to a TOML file first: the 16K row (TP 2, CP 4,
128 H100: one rank per stage after the fold over CP) and the 32K row (CP 8 over two servers,
256 H100: four CP coordinates per stage, `sim.engine.cp_symmetry`).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moe_rows_folding import FOLDING_ROWS

PHASES = Path(__file__).with_name("simulate_phases.py")
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
    # issue 33's "TP2 PP8 EP64 skewed case": 8 stages of 5 + 6 x 8 + 8 layers (61), SP as
    # Megatron-Core requires with MoE and TP; refused at the example's batch (76,197,120 ops
    # for 512 ranks that differ), timed at 16 micro-batches
    "deepseek-v3 1024 H100 tp2 pp8 ep64 skew 1, global batch 1024": (
        "deepseek-v3-1024-h100.toml",
        ["--set", "model.routing_skew=1", "--set", "parallel.tp=2", "--set", "parallel.sp=true",
         "--set", "parallel.pp=8", "--set", "parallel.pp_first_layers=5",
         "--set", "parallel.pp_last_layers=8", "--set", "parallel.global_batch=1024"]),
}
ROWS = {
    "folding T5 Mixtral-8x22B 16K tp2 cp4 pp8 (128 H100)": "Mixtral-8x22B MCore, 128 GPUs, 16K",
    "folding T5 Mixtral-8x22B 32K tp2 cp8 pp8 (256 H100)": "Mixtral-8x22B MCore, 256 GPUs, 32K",
}
"""Cases from the Folding paper's Table 5: the case's name -> its row's name."""


def toml_text(table: Mapping[str, Mapping[str, Any]]) -> str:
    """`table` (sections of scalars, a row's `MoeRow.config()`) as TOML."""
    def value(v: Any) -> str:
        return ("true" if v else "false") if isinstance(v, bool) else \
            repr(v) if isinstance(v, int | float) else json.dumps(v)
    return "".join(f"[{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in section.items())
                   for name, section in table.items())


def row_configs(folder: Path) -> dict[str, tuple[str, list[str]]]:
    """`ROWS` as cases: each row's experiment written to a TOML file in `folder`."""
    rows = {row.name: row for row in FOLDING_ROWS["folding-t5"]}
    cases = {}
    for n, (case, name) in enumerate(ROWS.items()):
        path = folder / f"folding-t5-{n}.toml"
        path.write_text(toml_text(rows[name].config()))
        cases[case] = (str(path), [])
    return cases


def run_once(config: str, extra: list[str]) -> tuple[float, float, str | None]:
    """(wall seconds, CPU seconds, the refusal's line or None) of one simulate process."""
    command = [sys.executable, "-m", "sim", "simulate", str(EXAMPLES / config), "--json", *extra]
    # (a row's config is an absolute path: `EXAMPLES / config` is then that path)
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


def phases_once(config: str, extra: list[str]) -> dict[str, Any]:
    """Process seconds per phase of one simulate process (`simulate_phases.py`)."""
    done = subprocess.run([sys.executable, str(PHASES), str(EXAMPLES / config), *extra],
                          capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout))


def phases_line(runs: list[dict[str, Any]]) -> str:
    """The median of each phase over `runs`, and the refusal where there is one."""
    names = [k for k in runs[0] if k != "refused"]
    line = " ".join(f"{k} {statistics.median(r[k] for r in runs):.2f}" for k in names)
    return f"{line}; refused: {runs[0]['refused']}" if "refused" in runs[0] else line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="run the cases whose name holds this")
    parser.add_argument("--phases", action="store_true",
                        help="process seconds per phase (medians) instead of the whole run's")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        cases = {**CASES, **row_configs(Path(folder))}
        for name, (config, extra) in cases.items():
            if args.only not in name:
                continue
            if args.phases:
                line = phases_line([phases_once(config, extra) for _ in range(args.repeat)])
                print(f"{name:52s} median of {args.repeat}: {line}", flush=True)
                continue
            runs = [run_once(config, extra) for _ in range(args.repeat)]
            refusal = runs[0][2]
            wall = statistics.median(run[0] for run in runs)
            cpu = statistics.median(run[1] for run in runs)
            took = f"{wall:.1f} s wall, {cpu:.2f} s CPU"
            result = f"refused in {took}: {refusal}" if refusal else took
            print(f"{name:52s} median of {args.repeat}: {result}", flush=True)


if __name__ == "__main__":
    main()
