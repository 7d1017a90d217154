"""The `parasim` command line (also `python -m sim`).

    parasim collective --cluster dgx-h100 --nodes 16 --op all_reduce --sizes 1M:4G --json
    parasim simulate [CONFIG.toml] [--json] [--report step.html] [--trace step.json]

`--json` prints one JSON object on stdout and nothing else. A user's mistake prints one line on
stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

from tqdm import tqdm

from sim.collective_table import OPS, format_table, parse_sizes, sweep_row
from sim.collectives import Collectives
from sim.config import example_path, load_experiment
from sim.replay import NETWORKS
from sim.simulate import predict, summary_json, summary_text
from topology.cluster import Cluster
from topology.config import build_cluster, load_cluster_file
from topology.presets import PRESETS
from traces.chrome import save_chrome
from traces.errors import ConfigError
from traces.io import save as save_trace


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a ConfigError (one line, exit 2) instead of usage."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        return args.handler(args)
    except ConfigError as err:
        print(f"parasim: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


def _build_parser() -> _Parser:
    parser = _Parser(prog="parasim", description="Simulate distributed LLM training steps.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    col = commands.add_parser("collective", help="nccl-tests-like table for one collective")
    _cluster_flags(col)
    col.add_argument("--op", default="all_reduce", choices=OPS)
    col.add_argument("--sizes", default="1K:1G", help="1M,16M | 1K:8G (doubling) | bytes")
    col.add_argument("--algo", default="auto", help="auto | ring | tree | hierarchical | rhd | "
                     "torus | direct")
    col.add_argument("--channels", type=int, help="rings/trees in parallel (default: one per NIC)")
    col.add_argument("--ranks", type=int, help="use the first N accelerators (default: all)")
    col.add_argument("--model", default="flow", choices=("flow", "analytic"))
    col.add_argument("--json", action="store_true", help="print one JSON object")
    col.set_defaults(handler=_collective)

    simp = commands.add_parser("simulate", help="predict one training step of a config")
    simp.add_argument("config", nargs="?", help="TOML config (default: the shipped GPT-3 "
                      "175B on 1024 A100s)")
    simp.add_argument("--json", action="store_true", help="print one JSON object")
    simp.add_argument("--report", metavar="HTML", help="write a plotly report")
    simp.add_argument("--trace", metavar="JSON", help="write the predicted timed trace")
    simp.add_argument("--chrome", metavar="JSON", help="write a Chrome/Perfetto trace")
    simp.add_argument("--network", choices=NETWORKS, help="flow (default), analytic, ideal")
    simp.add_argument("--algo", help="collective algorithm (default auto)")
    simp.add_argument("--profile", metavar="JSON", help="calibration profile")
    simp.add_argument("--no-fold", action="store_true",
                      help="simulate every rank instead of one per pipeline stage")
    simp.set_defaults(handler=_simulate)
    return parser


def _cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", default="dgx-h100",
                        help=f"a preset ({', '.join(PRESETS)}) or a TOML file with [cluster]")
    parser.add_argument("--nodes", type=int, help="servers (default 1, or the file's)")
    parser.add_argument("--fabric", help="fat-tree | rail | torus (default: the preset's)")


def _cluster(args: argparse.Namespace) -> Cluster:
    overrides: dict[str, Any] = {}
    if args.nodes is not None:
        overrides["nodes"] = args.nodes
    if args.fabric is not None:
        overrides["fabric"] = args.fabric
    if args.cluster in PRESETS:
        return build_cluster(args.cluster, **overrides)
    if not Path(args.cluster).suffix == ".toml":
        raise ConfigError(f"--cluster: {args.cluster!r} is neither a preset "
                          f"({', '.join(PRESETS)}) nor a .toml file")
    return load_cluster_file(args.cluster, overrides)


def _simulate(args: argparse.Namespace) -> int:
    outputs = [p for p in (args.report, args.trace, args.chrome) if p]
    for path in outputs:  # fail before the (long) simulation, not after it
        parent = Path(path).resolve().parent
        if not parent.is_dir():
            raise ConfigError(f"output {path}: directory {parent} does not exist")
    overrides = {k: v for k, v in (("network", args.network), ("algo", args.algo)) if v}
    if args.profile:
        overrides["profile"] = str(Path(args.profile).resolve())
    exp = load_experiment(args.config or example_path(), overrides)
    for warning in exp.warnings:
        print(f"parasim: warning: {warning}", file=sys.stderr)
    with _ProgressBar("simulate", "op") as bar:
        summary, times = predict(exp, fold=not args.no_fold, progress=bar.update)
    if args.trace or args.chrome:
        timed = times.timed_trace()
        if args.trace:
            save_trace(timed, args.trace)
        if args.chrome:
            save_chrome(timed, args.chrome)
    if args.report:
        from sim.report import write_report  # plotly loads only when a report is asked for

        write_report(args.report, exp, summary, times)
    if args.json:
        print(json.dumps(summary_json(exp, summary)))
    else:
        print(summary_text(exp, summary))
    return 0


class _ProgressBar:
    """A tqdm bar on stderr, drawn only when stderr is a terminal (never `\r` frames in logs)."""

    def __init__(self, desc: str, unit: str) -> None:
        self.bar = tqdm(desc=desc, unit=unit, delay=1.0, leave=False, mininterval=0.5,
                        disable=not sys.stderr.isatty())

    def update(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.update(done - self.bar.n)

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


def _collective(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    sizes = parse_sizes(args.sizes)
    ranks = args.ranks if args.ranks is not None else cluster.num_devices
    if not 2 <= ranks <= cluster.num_devices:
        raise ConfigError(f"--ranks: {ranks} must be between 2 and the cluster's "
                          f"{cluster.num_devices} accelerators")
    if args.channels is not None and args.channels < 1:
        raise ConfigError(f"--channels: {args.channels} must be at least 1")
    group = tuple(range(ranks))
    collectives = Collectives(cluster)
    rows = [
        sweep_row(cluster, collectives, args.op, group, size, args.algo, args.channels, args.model)
        for size in tqdm(sizes, desc="sizes", delay=1.0, leave=False,
                         disable=not sys.stderr.isatty())
    ]
    if args.json:
        print(json.dumps({"cluster": cluster.name, "op": args.op, "algo": args.algo,
                          "ranks": ranks, "model": args.model,
                          "rows": [asdict(r) for r in rows]}))
    else:
        print(format_table(cluster, args.op, args.algo, args.model, rows, ranks))
    return 0
