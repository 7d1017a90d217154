"""The `parasim` command line (also `python -m sim`).

    parasim collective --cluster dgx-h100 --nodes 16 --op all_reduce --sizes 1M:4G --json
    parasim simulate [CONFIG.toml] [--json] [--report step.html] [--trace step.json]
    parasim replay TRACE [--cluster PRESET_OR_TOML] [--nodes N] [--profile P] [--retime] [--json]
    parasim search [CONFIG.toml] [--gpus N] [--top K] [--workers N] [--ray ADDRESS] [--json]
    parasim run [CONFIG.toml] --out DIR [--steps N] [--warmup N] [--timeout S] [--kernels] [--json]
    parasim calibrate [DIR...] -o PROFILE.json [--run CLUSTER_OR_CONFIG] [--json]
    parasim validate [CONFIG.toml] [--profile P] [--report F.html] [--json]

`--json` prints one JSON object on stdout and nothing else. A user's mistake prints one line on
stderr and exits with status 2; Ctrl-C prints one line and exits with 130. Output files are
checked before the simulation starts and written all or none (`traces.files.Outputs`): a failed
or interrupted run leaves none of them behind.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

from tqdm import tqdm

from sim.collective_table import MAX_CHANNELS, OPS, format_table, parse_sizes, sweep_row
from sim.collectives import Collectives, parse_algorithm
from sim.config import example_path, load_experiment
from sim.profile import default_profile
from sim.provenance import file_sha256, flags_sha256, provenance
from sim.simulate import predict, summary_json, summary_text
from sim.timeline import annotate
from sim.transport import NETWORK_NAMES, NetworkMode
from topology.cluster import Cluster
from topology.config import read_cluster, read_cluster_file
from topology.presets import PRESETS
from traces.chrome import chrome_bytes, dumps_chrome
from traces.errors import ConfigError, show, warn
from traces.files import Outputs, check_outputs
from traces.io import dumps as dumps_trace


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a ConfigError (one line, exit 2) instead of usage."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stdout is None:  # started with stdout closed (`>&-`): print() would drop everything
        _error("stdout is closed; parasim prints its results there")
        return 2
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        return args.handler(args)
    except ConfigError as err:
        _error(str(err))
        return 2
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:  # the reader of our stdout stopped early (`| head`): not an error
        _silence_stdout()
        return 0


def _error(message: str) -> None:
    if sys.stderr is not None:
        print(f"parasim: error: {message}", file=sys.stderr)


def emit(text: str) -> None:
    """Print `text` on stdout and flush it now, so a full disk (`> /dev/full`) is one error line
    here rather than a traceback at exit."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as err:
        _silence_stdout()
        raise ConfigError(f"cannot write to stdout: {err.strerror or err}") from None


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of what could not be written
    neither fails nor prints a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests capture)
        pass


def _build_parser() -> _Parser:
    parser = _Parser(prog="parasim", description="Simulate distributed LLM training steps.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    col = commands.add_parser("collective", help="nccl-tests-like table for one collective")
    _cluster_flags(col)
    col.add_argument("--op", default="all_reduce", choices=OPS)
    col.add_argument("--sizes", default="1K:1G", help="1M,16M | 1K:8G (doubling) | bytes")
    col.add_argument("--algo", default="auto", help="auto | ring | tree | hierarchical | rhd | "
                     "torus | direct")
    col.add_argument("--channels", type=int, help=f"rings/trees in parallel, 1 to "
                     f"{MAX_CHANNELS} (default: one per NIC)")
    col.add_argument("--ranks", type=int, help="use the first N accelerators (default: all)")
    col.add_argument("--model", default=str(NetworkMode.FLOW),
                     choices=(str(NetworkMode.FLOW), str(NetworkMode.ANALYTIC)))
    col.add_argument("--json", action="store_true", help="print one JSON object")
    col.set_defaults(handler=_collective)

    simp = commands.add_parser("simulate", help="predict one training step of a config")
    simp.add_argument("config", nargs="?", help="TOML config (default: the shipped GPT-3 "
                      "175B on 1024 A100s)")
    simp.add_argument("--json", action="store_true", help="print one JSON object")
    simp.add_argument("--report", metavar="HTML", help="write a plotly report")
    simp.add_argument("--trace", metavar="JSON", help="write the predicted timed trace")
    simp.add_argument("--chrome", metavar="JSON", help="write a Chrome/Perfetto trace "
                      "(gzipped when it ends in .gz)")
    simp.add_argument("--report-ranks", metavar="R,R", help="ranks whose lanes the report "
                      "details (default: the first and the last pipeline stage's)")
    simp.add_argument("--network", choices=NETWORK_NAMES, help="flow (default), analytic, "
                      "ideal")
    simp.add_argument("--algo", help="collective algorithm (default auto)")
    simp.add_argument("--profile", metavar="JSON", help="calibration profile")
    simp.add_argument("--no-fold", action="store_true",
                      help="simulate every rank instead of one per pipeline stage")
    simp.set_defaults(handler=_simulate)

    from sim import replay_command  # the replay's own flags, beside its code

    rep = commands.add_parser("replay", help="re-simulate a measured or profiler trace")
    replay_command.add_arguments(rep)
    rep.set_defaults(handler=_replay)

    run = commands.add_parser("run", help="execute a config's plan for real (needs torch)")
    run.add_argument("config", nargs="?", help="TOML config (default: the shipped tiny GPT "
                     "on this machine, gpt-tiny-localhost.toml)")
    run.add_argument("--out", required=True, metavar="DIR", help="where the traces go")
    run.add_argument("--steps", type=int, default=1, help="recorded steps (default 1)")
    run.add_argument("--warmup", type=int, default=1, help="unrecorded steps first (default 1)")
    run.add_argument("--timeout", type=float, default=60.0,
                     help="seconds any collective, and the whole job, may take (default 60)")
    run.add_argument("--kernels", action="store_true", help="also write each rank's "
                     "torch.profiler trace of the recorded steps (kernels-rank<r>.json)")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.set_defaults(handler=_run)

    from sim.search.command import add_arguments  # the search's own flags, beside its code

    found = commands.add_parser("search", help="rank layouts: analytic screen of a space, "
                                "full simulation of the best, in parallel")
    add_arguments(found)
    found.set_defaults(handler=_search)

    from sim.calibrate import command as calibrate_command  # its flags, beside its code

    cal = commands.add_parser("calibrate", help="fit a profile: measure this machine (--run) "
                              "or fit recorded traces")
    calibrate_command.add_arguments(cal)
    cal.set_defaults(handler=lambda a: calibrate_command.run(a, emit=emit))

    from sim import validate  # its flags, beside its code

    val = commands.add_parser("validate", help="run a config for real, simulate it, compare "
                              "op by op, step and memory")
    validate.add_arguments(val)
    val.set_defaults(handler=lambda a: validate.run(a, emit=emit))
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
        spec = read_cluster({"preset": args.cluster, **overrides})
    elif Path(args.cluster).suffix == ".toml":
        spec = read_cluster_file(args.cluster, overrides)
    else:
        raise ConfigError(f"--cluster: {show(args.cluster)} is neither a preset "
                          f"({', '.join(PRESETS)}) nor a .toml file")
    return spec.build()


def _simulate(args: argparse.Namespace) -> int:
    config = Path(args.config) if args.config is not None else example_path()
    inputs = [config]
    overrides: dict[str, Any] = {k: v for k, v in (("network", args.network),
                                                   ("algo", args.algo)) if v is not None}
    if args.profile is not None:
        if not args.profile:
            raise ConfigError("--profile: an empty path names no file")
        inputs.append(Path(args.profile))
        overrides["profile"] = str(Path(args.profile).resolve())
    report_ranks = _ranks(args.report_ranks)
    exp = load_experiment(config, overrides)
    if exp.profile_path is not None:  # [sim] profile is an input too: never written over
        inputs.append(exp.profile_path)
    # Fail before the (long) simulation, not after it.
    targets = check_outputs({"--trace": args.trace, "--chrome": args.chrome,
                             "--report": args.report}, inputs=inputs)
    for warning in exp.warnings:
        warn(warning)
    with Outputs() as outputs:
        with _ProgressBar("simulate", "op") as bar:
            summary, times = predict(exp, fold=not args.no_fold, progress=bar.update)
        if "--trace" in targets or "--chrome" in targets:
            devices = exp.cluster.device_words[1]
            timed = annotate(times.timed_trace(), times, exp.model, exp.layout, devices)
            if "--trace" in targets:
                outputs.write(targets["--trace"], dumps_trace(timed))
            if "--chrome" in targets:
                outputs.write(targets["--chrome"],
                              chrome_bytes(dumps_chrome(timed), targets["--chrome"]))
        if "--report" in targets:
            from sim.report import render_report  # plotly loads only when a report is asked for

            outputs.write(targets["--report"], render_report(exp, summary, times,
                                                             report_ranks))
        outputs.commit()
        text = (json.dumps({**summary_json(exp, summary),
                            **provenance(exp.profile, file_sha256(config))}, allow_nan=False)
                if args.json else summary_text(exp, summary))
        try:
            emit(text)
        except BrokenPipeError:  # the reader stopped early; the files are complete: keep them
            _silence_stdout()
    return 0


def _ranks(text: str | None) -> list[int] | None:
    """--report-ranks: '0,64' -> [0, 64]."""
    if text is None:
        return None
    try:
        ranks = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"--report-ranks: {show(text)} is not a list of ranks (write e.g. "
                          "0,64)") from None
    if not ranks or len(ranks) > 64 or min(ranks) < 0:
        raise ConfigError(f"--report-ranks: {show(text)}: give 1 to 64 ranks, none negative")
    return ranks


def _replay(args: argparse.Namespace) -> int:
    from sim import replay_command

    return replay_command.run(args, emit=emit, progress_bar=_ProgressBar)


def _run(args: argparse.Namespace) -> int:
    from sim.run_command import RunFailed, check_run_args, execute, summary_text

    config = Path(args.config) if args.config is not None else example_path(
        "gpt-tiny-localhost.toml")
    out = check_run_args(args.out, args.steps, args.warmup, args.timeout)
    exp = load_experiment(config)
    try:
        summary = execute(exp, out, args.steps, args.warmup, args.timeout, args.kernels)
    except RunFailed as err:
        _error(str(err))
        return 1
    if summary is not None:  # rank 0 (or the local launcher) reports
        emit(json.dumps(summary, allow_nan=False) if args.json else summary_text(summary))
    return 0


def _search(args: argparse.Namespace) -> int:
    from sim.search.command import run as run_search

    return run_search(args, emit=emit, progress_bar=_ProgressBar)


class _ProgressBar:
    """A tqdm bar on stderr, drawn only when stderr is a terminal (never `\r` frames in logs)."""

    def __init__(self, desc: str, unit: str) -> None:
        self.bar = tqdm(desc=desc, unit=unit, delay=1.0, leave=False, mininterval=0.5,
                        disable=sys.stderr is None or not sys.stderr.isatty())

    def update(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.update(done - self.bar.n)

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


def _collective(args: argparse.Namespace) -> int:
    algo, model = parse_algorithm(args.algo), NetworkMode(args.model)
    if args.channels is not None and not 1 <= args.channels <= MAX_CHANNELS:
        raise ConfigError(f"--channels: {args.channels} must be from 1 to {MAX_CHANNELS} "
                          "(NCCL's most)")
    sizes = parse_sizes(args.sizes)
    cluster = _cluster(args)
    ranks = args.ranks if args.ranks is not None else cluster.num_devices
    if not 2 <= ranks <= cluster.num_devices:
        raise ConfigError(f"--ranks: {ranks} must be between 2 and the cluster's "
                          f"{cluster.num_devices} accelerators")
    group = tuple(range(ranks))
    collectives = Collectives(cluster)
    rows = [
        sweep_row(cluster, collectives, args.op, group, size, algo, args.channels, model)
        for size in tqdm(sizes, desc="sizes", delay=1.0, leave=False,
                         disable=sys.stderr is None or not sys.stderr.isatty())
    ]
    if args.json:
        # The cluster file's bytes, or for a preset the flags that shaped the table.
        digest = file_sha256(args.cluster) if args.cluster not in PRESETS else flags_sha256(
            {"cluster": args.cluster, "nodes": args.nodes, "fabric": args.fabric,
             "op": args.op, "sizes": sizes, "algo": args.algo, "channels": args.channels,
             "ranks": ranks, "model": args.model})
        emit(json.dumps({"cluster": cluster.name, "op": args.op, "algo": args.algo,
                         "ranks": ranks, "model": args.model,
                         "rows": [asdict(r) for r in rows],
                         **provenance(default_profile(cluster.accelerator), digest)},
                        allow_nan=False))
    else:
        emit(format_table(cluster, args.op, algo, model, rows, ranks))
    return 0
