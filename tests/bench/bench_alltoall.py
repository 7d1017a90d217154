"""Benchmark: all-to-all bus bandwidth against published nccl-tests `alltoall_perf` runs.

    python tests/bench/bench_alltoall.py [--data tests/bench/data/nccl_tests_alltoall.json]
                                         [--only SOURCE_ID]

Per source (a run on one system; provenance in the data file) and per size it prints the
published out-of-place busbw, the in-place one where the source gives it, what
`parasim collective --op all_to_all` gives on the matching preset and ranks (the flow model
running the lowering `auto` picks: NCCL's grouped sends `p2p/LL|Simple` where parasim has an
NCCL model, else plain `direct` flows), and the error against the out-of-place figure. Then
the MAPE per source, over all points and over the points of sources without a `caveat` (a
run on hardware the preset does not model), and the source's own spread (|in-place - out-of-place|
/ out-of-place), the yardstick the task sets for "off". Last, the maintainers' stated figures
(`facts`) that carry a busbw next to parasim's.
Where parasim has an NCCL model of the system, a line per size gives the CTAs NCCL's p2p
kernel copies with (`sim.collectives.nccl_p2p.busy_channels`, works a channel
`channel_works`, warps per work `p2p_warps`), the published busbw per CTA that implies (not
used by the model: no source gives a CTA's rate), and what the maintainers' "2 CTAs per
NVLink to saturate" (nccl#1703) would cap busbw at if read as one CTA moving at most half a
link.
busbw is nccl-tests' all-to-all factor: algbw x (n-1)/n.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from sim.collectives import Collectives
from sim.collectives.nccl_p2p import (
    P2P_MAX_WORKS_PER_BATCH,
    busy_channels,
    channel_works,
    p2p_warps,
    peer_plan,
)
from sim.collectives.protocols import NVLINK_LINK_BPS
from sim.collectives.sweep import Row, sweep_row
from topology import build_cluster

DATA = Path(__file__).parent / "data" / "nccl_tests_alltoall.json"


def group_of(ranges: list[list[int]]) -> tuple[int, ...]:
    """Device ids from the data file's [first, count] ranges."""
    return tuple(d for first, count in ranges for d in range(first, first + count))


def parasim_row(entry: dict, size: int) -> Row:
    """`parasim collective` for one size on the entry's preset and ranks (flow model)."""
    cluster = build_cluster(entry["preset"], nodes=entry["nodes"])
    return sweep_row(cluster, Collectives(cluster), "all_to_all", group_of(entry["group"]),
                     size, "auto", None, "flow")


def pct(x: float) -> str:
    return f"{100 * x:+6.1f}%"


def report(source: dict) -> list[float]:
    """One source's table; returns its |errors|."""
    ranks = len(group_of(source["group"]))
    print(f"\n== {source['id']}: {source['system']}\n   NCCL {source['nccl_version']}; "
          f"parasim: {source['preset']} x{source['nodes']}, {ranks} ranks")
    print(f"{'size':>12} {'published':>9} {'in-place':>9} {'parasim':>8} {'algo':>11} "
          f"{'err':>7} {'spread':>7}")
    errors, spreads = [], []
    for key, value in source["busbw_GBps"].items():
        size = int(key)
        row = parasim_row(source, size)
        err = (row.busbw_GBps - value) / value
        errors.append(abs(err))
        inplace = source.get("in_place_busbw_GBps", {}).get(key)
        spread = abs(inplace - value) / value if inplace is not None else None
        if spread is not None:
            spreads.append(spread)
        print(f"{size:>12} {value:9.2f} {inplace if inplace is not None else '-':>9} "
              f"{row.busbw_GBps:8.1f} {row.algo:>11} {pct(err)} "
              f"{pct(spread) if spread is not None else '-':>7}")
    ctas(source, source["busbw_GBps"])
    print(f"   MAPE {100 * statistics.mean(errors):.1f}%; source's own spread (in- vs "
          f"out-of-place) {100 * max(spreads, default=0):.1f}% at most")
    return errors


def ctas(source: dict, busbw: dict[str, float]) -> None:
    """NCCL's p2p CTAs per GPU for each size of `busbw` (size -> published GB/s), where
    parasim has an NCCL model (module docstring)."""
    cluster = build_cluster(source["preset"], nodes=source["nodes"])
    sys = Collectives(cluster).nccl_system(group_of(source["group"]))
    if sys is None:
        print("   CTAs: no NCCL model of this system in parasim")
        return
    for key, value in busbw.items():
        peer = int(key) / sys.num_ranks
        busy, plan, works = busy_channels(sys, peer), peer_plan(sys, peer), channel_works(sys, peer)
        warps = p2p_warps(min(works, P2P_MAX_WORKS_PER_BATCH))
        half_link = busy * NVLINK_LINK_BPS[sys.arch_index] / 2 / 1e9
        print(f"   CTAs at {key}: {busy} ({sys.num_ranks - 1} peers x {plan.channels} channels;"
              f" {works} works a channel out of place, {warps.send} send + {warps.recv} recv"
              " warps each):"
              f" published {value / busy:.1f} GB/s a CTA; half a link a CTA would cap busbw"
              f" at {half_link:.0f}")


def facts(data: dict) -> None:
    """The maintainers' stated busbw figures, next to parasim's."""
    for fact in data.get("facts", []):
        if "busbw_GBps" not in fact:
            continue
        for size in fact["sizes_bytes"]:
            row = parasim_row(fact, size)
            print(f"  stated {fact['busbw_GBps']} GB/s busbw ({fact['who']}, {fact['url']}): "
                  f"parasim {row.busbw_GBps:.1f} ({row.algo}) at {size} B, "
                  f"{pct((row.busbw_GBps - fact['busbw_GBps']) / fact['busbw_GBps'])}"
                  + (f" ({fact['note']})" if "note" in fact else ""))
            ctas(fact, {str(size): fact["busbw_GBps"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--only", help="one source id")
    args = parser.parse_args()
    data = json.loads(args.data.read_text())
    points: list[float] = []
    matched: list[float] = []
    for source in data["sources"]:
        if args.only in (None, source["id"]):
            errors = report(source)
            points += errors
            if "caveat" in source:
                print(f"   caveat: {source['caveat']}")
            else:
                matched += errors
    if points:
        print(f"\nMAPE over all {len(points)} (source, size) points: "
              f"{100 * statistics.mean(points):.1f}%; over the {len(matched)} whose hardware "
              f"is the preset's: {100 * statistics.mean(matched):.1f}%")
    if args.only is None:
        facts(data)


if __name__ == "__main__":
    main()
