"""`parasim calibrate`: measure this machine (or read traces already measured) and fit a profile.

    parasim calibrate --run localhost -o here.json [--ranks 2] [--sizes 4K:256M] [--json]
    parasim calibrate --run my-config.toml -o here.json      # its cluster, world and dtype
    parasim calibrate runs/tiny runs/bench -o here.json [--cluster localhost]

`--run` runs the microbenchmarks (`traces.bench`) with the executor — collective sweeps on every
group size and send/recv, a probe GEMM alone and beside a collective (comm_interference), then
compute probes over a grid of shapes — and fits their traces;
DIRs (parasim trace files, PyTorch-profiler JSON files, .json.gz too, or folders of either, read
as `parasim replay` reads them) are fitted as they are, and with `--run` too. `--run` refuses a
cluster whose devices this host does not have (a GPU preset needs CUDA GPUs of its model), and
DIRs whose traces say they ran on another kind of device (gloo: a CPU; NCCL: GPUs) than the
cluster's: figures measured on one device are never written as another's.
The cluster the fit is made on: the config's, `--cluster`, the `--run` target, or `localhost`
with as many ranks as the traces hold. Writes a version-2 profile (`calibrated: true`) that
`simulate`, `replay` and `validate` take with `--profile`; prints the fitted figures with their
95% intervals and residuals, and a warning line for each figure the data do not pin down
(the base profile's value kept: `sim.calibrate.fit`). The executor (and torch) load only for
`--run`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sim.calibrate.microbench import (
    DEFAULT_PROBES,
    DEFAULT_SIZES,
    bench_spec,
    check_measured_on,
    fit_target,
    host_backend,
    parse_probes,
    read_traces,
    resolve_target,
    run_microbenchmarks,
)
from sim.calibrate.summary import merged_notes, summary_json, summary_text
from sim.commands.common import Phases, emit, job_progress, parse_sizes, trace_files
from sim.provenance import files_sha256, flags_sha256, provenance
from sim.settings import add_set_flag, named_as_flags, parse_settings
from traces.errors import ConfigError, warn
from traces.files import Outputs, check_outputs
from traces.outdir import StagedDir, kept

HELP = "fit a profile: measure this machine (--run) or fit recorded traces"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="*", metavar="DIR",
                        help="folders of recorded traces (rank<r>.json) or trace files")
    parser.add_argument("-o", "--out", required=True, metavar="JSON", help="profile to write")
    parser.add_argument("--run", metavar="CLUSTER_OR_CONFIG",
                        help="run the microbenchmarks here first: a preset (localhost), a "
                        "cluster TOML, or a config (its cluster, world and dtype)")
    parser.add_argument("--cluster", metavar="CLUSTER_OR_CONFIG",
                        help="the cluster to fit DIRs on (default: localhost with the traces' "
                        "ranks)")
    parser.add_argument("--ranks", type=int, help="ranks for --run on a cluster (default: "
                        "the cluster's, at most the CPU count and 8)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="collective sizes (default "
                        f"{DEFAULT_SIZES}, doubling)")
    parser.add_argument("--repeats", type=int, default=5, help="calls per size (default 5)")
    parser.add_argument("--probes", default=DEFAULT_PROBES, metavar="HxSxB,...",
                        help="compute probes: hidden x sequence x micro-batch (default: a grid "
                        "of 8)")
    parser.add_argument("--keep", metavar="DIR", help="keep the microbenchmark traces here")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds the microbenchmarks may take (default 600)")
    parser.add_argument("--name", help="the profile's name (default: from the output file)")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="fit traces of a failed run too (marked incomplete: meta.complete "
                        "false); refused by default")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_set_flag(parser)


def run(args: argparse.Namespace) -> int:
    if not args.dirs and args.run is None:
        raise ConfigError("calibrate: give trace folders to fit, or --run CLUSTER_OR_CONFIG to "
                          "measure this machine")
    if args.run is not None and args.cluster is not None:
        raise ConfigError("--cluster: with --run the cluster is the --run target's")
    inputs = [f for d in args.dirs for f in trace_files(Path(d))]
    settings = parse_settings(args.settings)
    targets = check_outputs({"--out": args.out}, inputs=inputs)
    if args.keep is not None and args.run is None:
        raise ConfigError("--keep: keeps the traces --run measures; without --run there are "
                          "none")
    keep = (None if args.keep is None  # checked before minutes of measuring
            else StagedDir.check("--keep", args.keep, inputs=[*args.dirs, *inputs],
                                 force_flag=""))
    with kept(keep) as keep_dir, Phases("calibrate", 1 + (args.run is not None)) as phase:
        phase("reading traces")
        traces = [read_traces(Path(d), args.allow_incomplete) for d in args.dirs]
        if args.run is not None:
            phase("microbenchmarks")
            with named_as_flags(settings):
                target = resolve_target(args.run, args.ranks, settings)
            spec = bench_spec(target, parse_sizes(args.sizes), args.repeats,
                              parse_probes(args.probes, target))
            backend = host_backend(target.cluster, target.world, f"--run {args.run}")
            with job_progress("microbenchmarks", 1):
                traces.append(run_microbenchmarks(spec, keep_dir, args.timeout,
                                                  backend=backend))
        else:
            with named_as_flags(settings):
                target = fit_target(args.cluster, traces, settings)
    for trace, where in zip(traces, args.dirs):
        check_measured_on(trace, target, where)
    from sim.calibrate.fit import fit_profile  # scipy loads only when a fit is made

    name = args.name or Path(args.out).stem
    profile, report = fit_profile(traces, target.cluster, base=target.profile, name=name)
    for note in merged_notes(report.unidentified):
        warn(f"calibrate: {note}")
    with Outputs(targets.values()) as outputs:
        outputs.write(targets["--out"], json.dumps(profile.to_json(), indent=1,
                                                   allow_nan=False) + "\n")
        outputs.commit()
        summary = summary_json(profile, report, target, str(targets["--out"]))
        if args.json:
            emit(json.dumps({**summary, **provenance(profile, _inputs_sha256(args, inputs))},
                            allow_nan=False))
        else:
            emit(summary_text(summary))
    return 0


def _inputs_sha256(args: argparse.Namespace, inputs: list[Path]) -> str:
    """What the fit came from: the traces' bytes and the flags that chose the measurements."""
    flags = {k: getattr(args, k) for k in ("run", "cluster", "ranks", "sizes", "repeats",
                                           "probes")}
    if args.settings:  # only then: digests without --set stay as they were
        flags["set"] = [str(text) for text in args.settings]
    return flags_sha256({**flags, "traces": files_sha256(inputs) if inputs else None})
