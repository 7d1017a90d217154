"""Benchmark: reading the two real GPU profiles of tests/data/kineto with traces.kineto.

    python tests/bench/bench_kineto.py [--repeat 5]

Prints, per file, its size, the events in it, the ops found and the median wall time of
`load_kineto` over the runs, wall and CPU (the CPU time holds on a busy machine). Target: under
2 s for the 1.7 MB gz (35 MB of JSON, 109k events).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from traces.kineto import load_kineto

DATA = Path(__file__).parent.parent / "data" / "kineto"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for path in sorted(DATA.glob("*.json.gz")):
        seconds, cpu = [], []
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            trace = load_kineto(path)
            seconds.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        comms = sum(op.kind != "compute" for ops in trace.ops.values() for op in ops)
        print(f"{path.name}: {path.stat().st_size / 1e6:.2f} MB gz, {trace.num_ops()} ops "
              f"({comms} communication), load {statistics.median(seconds):.3f} s wall, "
              f"{statistics.median(cpu):.3f} s CPU (medians of {args.repeat})")


if __name__ == "__main__":
    main()
