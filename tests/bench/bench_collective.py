"""Benchmark: a 1 GiB all-reduce across 1024 GPUs (128 DGX H100 on rails), flow model.

    python tests/bench/bench_collective.py [--repeat 5]

Each run is a fresh process (so peak RSS is its own): build the cluster, lower the collective,
run the flow model. Prints medians over the runs: wall time per part, peak memory, simpy
events and events per second of engine time. Target: <= 2 s per algorithm on one core.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

SIZE = 2**30


def one(algo: str, analytic_path: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    import simpy

    from sim.collectives import Collectives
    from sim.engine.network import Network
    from topology import build_cluster
    from traces.ops import OpKind

    cluster = build_cluster("dgx-h100", nodes=128, fabric="rail")
    t1 = time.perf_counter()
    lowering = Collectives(cluster).lowering(OpKind.ALL_REDUCE, tuple(range(1024)), algo)
    t2 = time.perf_counter()
    env = simpy.Environment()
    net = Network(env, cluster.link_capacity, analytic_path=analytic_path)
    done = net.run(net.register(lowering), SIZE)
    events = 0
    while not done.processed:
        env.step()
        events += 1
    t3 = time.perf_counter()
    return {
        "build_s": t1 - t0, "lower_s": t2 - t1, "engine_s": t3 - t2, "total_s": t3 - t0,
        "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "events": events, "events_per_s": events / (t3 - t2), "simulated_ms": env.now * 1e3,
        "reshares": net.num_reshares,
        "busbw_GBps": 2 * 1023 / 1024 * SIZE / env.now / 1e9,
    }


def stress() -> dict[str, float]:
    """Engine rate: 128 servers each run 100 back-to-back 8-GPU all-reduces while every GPU
    streams sends to the next server and the one after over its rail; the two streams share
    the GPU's NIC, so re-shares happen all the time."""
    import simpy

    from sim.collectives import Collectives
    from sim.collectives.direct import lower_p2p
    from sim.engine.network import Network
    from topology import build_cluster
    from traces.ops import OpKind

    cluster = build_cluster("dgx-h100", nodes=128, fabric="rail")
    col = Collectives(cluster)
    env = simpy.Environment()
    net = Network(env, cluster.link_capacity)

    def server(s: int):
        lowering = col.lowering(OpKind.ALL_REDUCE, tuple(range(8 * s, 8 * s + 8)), "ring")
        assert lowering is not None
        handle = net.register(lowering)
        for _ in range(100):
            yield net.run(handle, 16 * 2**20)

    def stream(gpu: int, hop: int):
        handle = net.register(lower_p2p(cluster, gpu, (gpu + hop) % 1024))
        for i in range(20):
            yield net.run(handle, (64 + 8 * (i % 3)) * 2**20)

    for s in range(128):
        env.process(server(s))
    for gpu in range(1024):
        env.process(stream(gpu, 8))
        env.process(stream(gpu, 16))
    t0, events = time.perf_counter(), 0
    while env.peek() != float("inf"):
        env.step()
        events += 1
    seconds = time.perf_counter() - t0
    return {"events": events, "engine_s": seconds, "events_per_s": events / seconds,
            "reshares": net.num_reshares}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--flows-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, analytic_path=not args.flows_only)))
        return
    print(f"{'algo':34} {'total s':>8} {'build s':>8} {'lower s':>8} {'engine s':>8} "
          f"{'peak MiB':>9} {'events':>7} {'reshares':>8} {'sim ms':>8} {'busbw':>7}")
    for algo in ("ring", "hierarchical"):
        for flows_only in (False, True):
            argv = [sys.executable, __file__, "--one", algo] + ["--flows-only"] * flows_only
            runs = [json.loads(subprocess.run(argv, capture_output=True, text=True,
                                              check=True).stdout) for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            name = algo + (" (flows, no shortcut)" if flows_only else "")
            print(f"{name:34} {med['total_s']:8.3f} {med['build_s']:8.3f} "
                  f"{med['lower_s']:8.3f} {med['engine_s']:8.3f} {med['peak_rss_MiB']:9.1f} "
                  f"{med['events']:7.0f} {med['reshares']:8.0f} {med['simulated_ms']:8.3f} "
                  f"{med['busbw_GBps']:7.1f}")
    print(f"(medians of {args.repeat} fresh processes; busbw in GB/s)")
    runs = [stress() for _ in range(3)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"engine stress (12,800 all-reduces + 40,960 rail sends): {med['events']:.0f} events, "
          f"{med['reshares']:.0f} re-shares in {med['engine_s']:.2f} s = "
          f"{med['events_per_s']:,.0f} events/s (median of 3)")


if __name__ == "__main__":
    main()
