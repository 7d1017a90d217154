"""`parasim collective`: an nccl-tests-like table of one collective over message sizes.

    parasim collective --cluster dgx-h100 --nodes 16 --op all_reduce --sizes 1M:4G [--json]
    parasim collective --op reduce -b 8 -e 128M -f 2 -d bfloat16 --profile here.json

Each size runs alone on the network (`sim.collectives.sweep`), with the flow model or the
analytic path; busbw uses nccl-tests' factors; the table reads like nccl-tests'. `--profile`
puts a calibrated profile's measured links in the cluster's place, as `simulate` does.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from sim.collectives import Collectives, parse_algorithm
from sim.collectives.sweep import (
    DTYPES,
    MAX_CHANNELS,
    OPS,
    REDOPS,
    avg_busbw,
    format_table,
    geometric_sizes,
    sweep_row,
)
from sim.commands.common import (
    cluster_flags,
    cluster_from_flags,
    emit,
    parse_sizes,
    profile_flag,
    progress_over,
)
from sim.engine.transport import NetworkMode
from sim.profile import default_profile, load_profile
from sim.provenance import file_sha256, flags_sha256, provenance
from sim.settings import add_set_flag, apply_settings, config_sha256, named_as_flags, parse_settings
from topology.config import KEYS as CLUSTER_KEYS
from topology.presets import PRESETS
from traces.errors import ConfigError
from traces.units import parse_size

HELP = "nccl-tests-like table for one collective"
DEFAULT_SIZES = "1K:1G"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cluster_flags(parser, "dgx-h100", " (default dgx-h100)")
    parser.add_argument("--op", default="all_reduce", choices=OPS)
    parser.add_argument("--sizes", help=f"1M,16M | 1K:8G (doubling) | bytes (default "
                        f"{DEFAULT_SIZES}; or nccl-tests' -b/-e/-f)")
    parser.add_argument("-b", "--minbytes", help="nccl-tests: the first size (default 1K)")
    parser.add_argument("-e", "--maxbytes", help="nccl-tests: the last size (default 1G)")
    parser.add_argument("-f", "--stepfactor", type=int, default=2,
                        help="nccl-tests: each size this many times the last (default 2)")
    parser.add_argument("-d", "--datatype", default="float", choices=tuple(DTYPES),
                        help="nccl-tests: the type the count column counts (default float)")
    parser.add_argument("-o", "--redop", default="sum", choices=REDOPS,
                        help="nccl-tests: the reduction shown (default sum)")
    parser.add_argument("-r", "--root", type=int, default=0,
                        help="nccl-tests: the root of broadcast and reduce (default 0)")
    parser.add_argument("--algo", default="auto", help="auto | ring | tree (NCCL's, where "
                        "NCCL runs) | ring_flows | tree_flows (parasim's own) | hierarchical "
                        "| rhd | torus | direct")
    parser.add_argument("--channels", type=int, help=f"rings/trees in parallel, 1 to "
                        f"{MAX_CHANNELS} (default: one per NIC)")
    parser.add_argument("--ranks", type=int, help="use the first N accelerators (default: all)")
    parser.add_argument("--model", default=str(NetworkMode.FLOW),
                        choices=(str(NetworkMode.FLOW), str(NetworkMode.ANALYTIC)))
    parser.add_argument("--profile", metavar="JSON", help="calibration profile: its measured "
                        "links replace the cluster's")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_set_flag(parser, hf_model=False)


def sizes_of(args: argparse.Namespace) -> list[int]:
    """--sizes, or nccl-tests' -b/-e/-f (one form, not both)."""
    if args.minbytes is None and args.maxbytes is None and args.stepfactor == 2:
        return parse_sizes(args.sizes if args.sizes is not None else DEFAULT_SIZES)
    if args.sizes is not None:
        raise ConfigError("--sizes: give it or nccl-tests' -b/-e/-f, not both")
    lo = parse_size(args.minbytes if args.minbytes is not None else "1K", "-b")
    hi = parse_size(args.maxbytes if args.maxbytes is not None else "1G", "-e")
    sizes = geometric_sizes(lo, hi, args.stepfactor)
    return parse_sizes(",".join(map(str, sizes)))  # the same bound on the count


def run(args: argparse.Namespace) -> int:
    algo, model = parse_algorithm(args.algo), NetworkMode(args.model)
    if args.channels is not None and not 1 <= args.channels <= MAX_CHANNELS:
        raise ConfigError(f"--channels: {args.channels} must be from 1 to {MAX_CHANNELS} "
                          "(NCCL's most)")
    sizes = sizes_of(args)
    settings = parse_settings(args.settings, {"cluster": CLUSTER_KEYS})
    with named_as_flags(settings):
        cluster = cluster_from_flags(args, apply_settings({}, settings).get("cluster"))
    profile_path = profile_flag(args.profile, [])
    profile = load_profile(profile_path) if profile_path else default_profile(cluster.accelerator)
    if profile_path:
        cluster = profile.applied_to(cluster)
    ranks = args.ranks if args.ranks is not None else cluster.num_devices
    if not 2 <= ranks <= cluster.num_devices:
        raise ConfigError(f"--ranks: {ranks} must be between 2 and the cluster's "
                          f"{cluster.num_devices} accelerators")
    if not 0 <= args.root < ranks:
        raise ConfigError(f"-r/--root: {args.root} must be a rank from 0 to {ranks - 1}")
    group = tuple(range(ranks))
    collectives = Collectives(cluster)
    rows = [sweep_row(cluster, collectives, args.op, group, size, algo, args.channels, model,
                      args.datatype, args.redop, args.root)
            for size in progress_over(sizes, "sizes")]
    if not args.json:
        emit(format_table(cluster, args.op, algo, model, rows, ranks))
        return 0
    # The cluster file's bytes, or for a preset the flags that shaped the table (the
    # nccl-tests flags only where given, so today's tables keep their digest).
    extra = {k: v for k, v, default in (
        ("datatype", args.datatype, "float"), ("redop", args.redop, "sum"),
        ("root", args.root, 0), ("profile", profile_path and file_sha256(profile_path), None),
        ("set", [[st.key, st.value] for st in settings], []))
        if v != default}
    digest = config_sha256(args.cluster, settings) if args.cluster not in PRESETS else \
        flags_sha256({"cluster": args.cluster, "nodes": args.nodes, "fabric": args.fabric,
                      "op": args.op, "sizes": sizes, "algo": args.algo,
                      "channels": args.channels, "ranks": ranks, "model": args.model, **extra})
    emit(json.dumps({"cluster": cluster.name, "op": args.op, "algo": args.algo, "ranks": ranks,
                     "model": args.model, "rows": [asdict(r) for r in rows],
                     "avg_busbw_GBps": avg_busbw(rows),
                     **provenance(profile, digest)},
                    allow_nan=False))
    return 0
