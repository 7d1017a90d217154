"""`parasim collective`: an nccl-tests-like table of one collective over message sizes.

    parasim collective --cluster dgx-h100 --nodes 16 --op all_reduce --sizes 1M:4G [--json]

Each size runs alone on the network (`sim.collectives.sweep`), with the flow model or the
analytic path; busbw uses nccl-tests' factors.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from sim.collectives import Collectives, parse_algorithm
from sim.collectives.sweep import MAX_CHANNELS, OPS, format_table, sweep_row
from sim.commands.common import (
    cluster_flags,
    cluster_from_flags,
    emit,
    parse_sizes,
    progress_over,
)
from sim.engine.transport import NetworkMode
from sim.profile import default_profile
from sim.provenance import file_sha256, flags_sha256, provenance
from topology.presets import PRESETS
from traces.errors import ConfigError

HELP = "nccl-tests-like table for one collective"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cluster_flags(parser, "dgx-h100", " (default dgx-h100)")
    parser.add_argument("--op", default="all_reduce", choices=OPS)
    parser.add_argument("--sizes", default="1K:1G", help="1M,16M | 1K:8G (doubling) | bytes")
    parser.add_argument("--algo", default="auto", help="auto | ring | tree | hierarchical | "
                        "rhd | torus | direct")
    parser.add_argument("--channels", type=int, help=f"rings/trees in parallel, 1 to "
                        f"{MAX_CHANNELS} (default: one per NIC)")
    parser.add_argument("--ranks", type=int, help="use the first N accelerators (default: all)")
    parser.add_argument("--model", default=str(NetworkMode.FLOW),
                        choices=(str(NetworkMode.FLOW), str(NetworkMode.ANALYTIC)))
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    algo, model = parse_algorithm(args.algo), NetworkMode(args.model)
    if args.channels is not None and not 1 <= args.channels <= MAX_CHANNELS:
        raise ConfigError(f"--channels: {args.channels} must be from 1 to {MAX_CHANNELS} "
                          "(NCCL's most)")
    sizes = parse_sizes(args.sizes)
    cluster = cluster_from_flags(args)
    ranks = args.ranks if args.ranks is not None else cluster.num_devices
    if not 2 <= ranks <= cluster.num_devices:
        raise ConfigError(f"--ranks: {ranks} must be between 2 and the cluster's "
                          f"{cluster.num_devices} accelerators")
    group = tuple(range(ranks))
    collectives = Collectives(cluster)
    rows = [sweep_row(cluster, collectives, args.op, group, size, algo, args.channels, model)
            for size in progress_over(sizes, "sizes")]
    if not args.json:
        emit(format_table(cluster, args.op, algo, model, rows, ranks))
        return 0
    # The cluster file's bytes, or for a preset the flags that shaped the table.
    digest = file_sha256(args.cluster) if args.cluster not in PRESETS else flags_sha256(
        {"cluster": args.cluster, "nodes": args.nodes, "fabric": args.fabric, "op": args.op,
         "sizes": sizes, "algo": args.algo, "channels": args.channels, "ranks": ranks,
         "model": args.model})
    emit(json.dumps({"cluster": cluster.name, "op": args.op, "algo": args.algo, "ranks": ranks,
                     "model": args.model, "rows": [asdict(r) for r in rows],
                     **provenance(default_profile(cluster.accelerator), digest)},
                    allow_nan=False))
    return 0
