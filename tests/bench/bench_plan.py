"""Benchmark: the plan builder's time alone (`traces.plan.build`), A/B between checkouts.

    python tests/bench/bench_plan.py --trees /work/main . [--repeat 5] [--only gpt3-1024]

Each run is a fresh process importing one tree's code (`PYTHONPATH`) that loads a case of
`plan_digest.CASES` and times `build` alone (wall and CPU seconds: on a loaded machine
the CPU time's spread is the smaller) (folded as `parasim simulate` builds it). The trees
alternate run by run, so load on a shared machine falls on both alike; prints each tree's
median and the ratio to the first tree's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD = """
import sys
sys.path.insert(0, sys.argv[2])
from plan_digest import plan_lines
_, seconds, cpu, ops = plan_lines(sys.argv[1])
print(seconds, cpu, ops)
"""
DEFAULT = ["gpt3-1024", "gpt3-512-h100-overlap"]


def one(tree: Path, case: str) -> tuple[float, float, int]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # -P: the tree on PYTHONPATH, not the current folder, is what the child imports
    out = subprocess.run([sys.executable, "-P", "-c", CHILD, case, str(HERE)], env=env,
                         check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", type=Path, default=[Path(".")])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=DEFAULT)
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    for case in args.only:
        times: dict[Path, list[float]] = {tree: [] for tree in trees}
        cpus: dict[Path, list[float]] = {tree: [] for tree in trees}
        ops: dict[Path, int] = {}
        for _ in range(args.repeat):
            for tree in trees:
                seconds, cpu, ops[tree] = one(tree, case)
                times[tree].append(seconds)
                cpus[tree].append(cpu)
        base = statistics.median(times[trees[0]])
        base_cpu = statistics.median(cpus[trees[0]])
        for tree in trees:
            median, cpu = statistics.median(times[tree]), statistics.median(cpus[tree])
            print(f"{case} [{tree}]: {ops[tree]:,} ops, build median {median:.2f} s wall "
                  f"(min {min(times[tree]):.2f}, max {max(times[tree]):.2f}) "
                  f"x{median / base:.2f} of the first; CPU {cpu:.2f} s "
                  f"(min {min(cpus[tree]):.2f}) x{cpu / base_cpu:.2f}")


if __name__ == "__main__":
    main()
