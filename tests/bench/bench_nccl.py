"""Benchmark: all_reduce bus bandwidth on one DGX-A100 and one DGX-H100, 1 MiB to 8 GiB:
published nccl-tests runs, NCCL's own model, and parasim's NCCL model, with errors.

    python tests/bench/bench_nccl.py [--data tests/bench/data/nccl_tests_allreduce.json]

Per size it prints what NCCL picks (algorithm/protocol/channels), NCCL's predicted busbw,
parasim's closed form and what `parasim collective` gives (the flow model running the lowering
`auto` picks), the median of the published runs and each run, and the error of
`parasim collective` against the median.
Then the MAPE over the sizes that have measurements: against the median, and against each
source with the launch style that source used (one process per GPU, or one thread for all
8 GPUs as `all_reduce_perf -g 8` does), with that source's error per size, and over every
(source, size) point. Last, per source, the line t = a + S / B fitted through its own points in
the LL128 range (2-16 MiB) and the Simple range (32 MiB and up), next to the bandwidth NCCL's
model uses there: what each run's marginal bus bandwidth and fixed cost are, independent of
any model. Sources and their provenance are in the data file.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from sim.collectives import Collectives
from sim.collectives.nccl import latency
from sim.collectives.nccl_plan import LAUNCH_S, LAUNCH_SINGLE_THREAD_S, NcclPlan, plan
from sim.collectives.nccl_system import NcclSystem, system_for
from sim.collectives.protocols import Algo
from sim.collectives.sweep import sweep_row
from topology import build_cluster
from topology.cluster import Cluster
from traces.ops import OpKind

DATA = Path(__file__).parent / "data" / "nccl_tests_allreduce.json"
SIZES = [2**k for k in range(20, 34)]  # 1 MiB .. 8 GiB
LAUNCH = {"process": LAUNCH_S, "thread": LAUNCH_SINGLE_THREAD_S}


def busbw(p: NcclPlan, seconds: float) -> float:
    """nccl-tests' all-reduce bus bandwidth, GB/s: algbw x 2(n-1)/n."""
    return p.size_bytes / seconds * 2 * (p.num_ranks - 1) / p.num_ranks / 1e9


def mape(errors: list[float]) -> str:
    return f"{100 * statistics.mean(errors):5.1f}%" if errors else "   - "


def report(system: str, cluster: Cluster, sys: NcclSystem, sources: list[dict]) -> None:
    print(f"\n== {system}: {sys.num_ranks} GPUs, ring {sys.ring.channels} x "
          f"{sys.ring.bw_intra_Bps / 1e9:g} GB/s, {sys.comm_channels} channels"
          + (f", NVLS {sys.nvls.channels} x {sys.nvls.bw_intra_Bps / 1e9:g} GB/s"
             if sys.nvls else ""))
    names = [s["id"] for s in sources]
    collectives = Collectives(cluster)
    group = tuple(range(cluster.num_devices))
    print(f"{'size':>6} {'NCCL picks':>18} {'NCCL':>7} {'closed':>7} {'parasim':>8} {'median':>7} "
          f"{'err':>7} {'NCCL err':>8}  " + " ".join(f"{n[-16:]:>16}" for n in names))
    ours_err: list[float] = []
    nccl_err: list[float] = []
    per_source: dict[str, list[float]] = {n: [] for n in names}
    for size in SIZES:
        p = plan(sys, OpKind.ALL_REDUCE, size)
        nccl, closed = busbw(p, p.nccl_time_s), busbw(p, p.time_s)
        row = sweep_row(cluster, collectives, "all_reduce", group, size, "auto", None, "flow")
        ours = row.busbw_GBps
        measured = {s["id"]: s["busbw_GBps"][str(size)] for s in sources
                    if str(size) in s["busbw_GBps"]}
        med = statistics.median(measured.values()) if measured else None
        pick = f"{p.algorithm}/{p.protocol}/{p.channels}"
        line = f"{size >> 20:5d}M {pick:>18} {nccl:7.1f} {closed:7.1f} {ours:8.1f} "
        if med is None:
            print(line + f"{'-':>7}")
            continue
        ours_err.append(abs(ours - med) / med)
        nccl_err.append(abs(nccl - med) / med)
        line += f"{med:7.1f} {100 * (ours - med) / med:+6.1f}% {100 * (nccl - med) / med:+7.1f}%  "
        cells = []
        for s in sources:
            value = measured.get(s["id"])
            if value is None:
                cells.append(f"{'-':>16}")
                continue
            matched = plan(sys, OpKind.ALL_REDUCE, size, launch_s=LAUNCH[s["launch"]])
            per_source[s["id"]].append(abs(busbw(matched, matched.time_s) - value) / value)
            cells.append(f"{value:16.2f}")
        print(line + " ".join(cells))
    print(f"MAPE vs median of sources: parasim {mape(ours_err)}, NCCL's model {mape(nccl_err)}")
    points: list[float] = []
    for s in sources:
        errors = per_source_signed(sys, s)
        points += [abs(e) for e in errors.values()]
        print(f"  MAPE vs {s['id']:<22} ({s['launch']:>7} launch, NCCL {s['nccl_version']}): "
              f"{mape(per_source[s['id']])}  per size: "
              + " ".join(f"{size >> 20}M {100 * e:+.0f}%" for size, e in errors.items()))
    print(f"MAPE over all {len(points)} (source, size) points, each with its launch style: "
          f"{mape(points)}")
    marginal(sys, sources)


def per_source_signed(sys: NcclSystem, source: dict) -> dict[int, float]:
    """Signed busbw error of the closed form against one source, with its launch style."""
    errors = {}
    for size in SIZES:
        value = source["busbw_GBps"].get(str(size))
        if value is not None:
            p = plan(sys, OpKind.ALL_REDUCE, size, launch_s=LAUNCH[source["launch"]])
            errors[size] = (busbw(p, p.time_s) - value) / value
    return errors


def marginal(sys: NcclSystem, sources: list[dict]) -> None:
    """Each run's own t = a + S / B (least squares, B as a bus bandwidth) over the sizes where
    NCCL runs one protocol, against that protocol's bandwidth in NCCL's model."""
    n = sys.num_ranks
    for lo, hi in ((2 << 20, 16 << 20), (32 << 20, 8 << 30)):
        p = plan(sys, OpKind.ALL_REDUCE, hi)
        model_bus = (p.size_bytes / (p.nccl_time_s - latency(sys, OpKind.ALL_REDUCE,
                                                               p.algorithm, p.protocol))
                     * 2 * (n - 1) / n / 1e9)
        label = f"{lo >> 20}M-{hi >> 20}M {p.algorithm}/{p.protocol}"
        for s in sources:
            pts = [(int(k), int(k) / (v * 1e9 * n / (2 * (n - 1))))
                   for k, v in s["busbw_GBps"].items() if lo <= int(k) <= hi]
            if len(pts) < 3:
                continue
            slope, intercept = np.polyfit([x for x, _ in pts], [t for _, t in pts], 1)
            bus = 2 * (n - 1) / n / slope / 1e9
            print(f"  fit {label:<20} {s['id']:<22} a = {intercept * 1e6:6.1f} us, "
                  f"B = {bus:5.0f} GB/s bus ({bus / model_bus:.2f} x NCCL's {model_bus:.0f})")


def ring_check(sys: NcclSystem, facts: list[dict]) -> None:
    """Forced ring on H100 against the published NCCL_ALGO=RING figures."""
    for fact in facts:
        if "ring_busbw_GBps" not in fact:
            continue
        lo, hi = fact["ring_busbw_GBps"]
        for size in fact["sizes_bytes"]:
            p = plan(sys, OpKind.ALL_REDUCE, size, algo=Algo.RING)
            print(f"  ring {size >> 20}M forced: parasim {busbw(p, p.time_s):.1f} GB/s, "
                  f"NCCL {busbw(p, p.nccl_time_s):.1f}, published {lo:g}-{hi:g} "
                  f"({fact['url']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    data = json.loads(args.data.read_text())
    for system in ("dgx-a100", "dgx-h100"):
        cluster = build_cluster(system, nodes=1)
        sys = system_for(cluster, tuple(range(cluster.num_devices)))
        report(system, cluster, sys, [s for s in data["sources"] if s["system"] == system])
        if system == "dgx-h100":
            ring_check(sys, [f for f in data["facts"] if f["system"] == system])


if __name__ == "__main__":
    main()
