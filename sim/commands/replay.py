"""The `parasim replay` command: its flags, its output files, its summary (text or --json).

    parasim replay TRACE [--cluster PRESET_OR_TOML] [--nodes N] [--fabric F] [--profile P]
                   [--retime] [--network flow|analytic|ideal] [--algo A] [--json]
                   [--trace OUT.json] [--chrome OUT.json]

TRACE is a parasim trace file, a PyTorch-profiler JSON (.json / .json.gz), a folder of
per-rank files of either kind, or a folder of Chakra ET files (`<name>.<rank>.et`, as `parasim
export --chakra` writes them; `sim.measured`). Output files are checked before the replay
and written all or none. `--json` counts the compute ops timed by the model
(`retimed_compute`), those that kept their measured durations (`kept_measured_compute`), and
among those the ones the trace states no FLOPs or bytes for
(`kept_measured_compute_no_flops_bytes`: a profiler's, which `--retime` cannot re-time, and
says so on stderr).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sim.collectives import parse_algorithm
from sim.commands.common import ProgressBar, emit, profile_flag, trace_files, write_timed
from sim.engine.transport import NETWORK_NAMES, NetworkMode
from sim.measured import ReplayResult, choose_cluster, load_trace, replay_trace
from sim.profile import load_profile
from sim.provenance import file_sha256, files_sha256, provenance
from topology.presets import PRESETS
from traces.errors import warn
from traces.files import Outputs, check_outputs
from traces.kineto import dropped

HELP = "re-simulate a measured or profiler trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", metavar="TRACE", help="a parasim trace, a PyTorch-profiler "
                        "JSON (.json, .json.gz), a folder of per-rank files, or a folder of "
                        "Chakra ET files (NAME.<rank>.et)")
    parser.add_argument("--cluster", help=f"a preset ({', '.join(PRESETS)}) or a TOML file "
                        "with [cluster] (default: the cluster a parasim trace names)")
    parser.add_argument("--nodes", type=int, help="servers (default: the cluster's)")
    parser.add_argument("--fabric", help="fat-tree | rail | torus (default: the cluster's)")
    parser.add_argument("--profile", metavar="JSON", help="calibration profile")
    parser.add_argument("--retime", action="store_true", help="time compute ops that carry "
                        "FLOPs/bytes by the compute model instead of keeping their durations")
    parser.add_argument("--no-host-gaps", action="store_true",
                        help="drop the idle time a measured trace shows between ops that no "
                        "dependency explains (host launch delays); kept by default")
    parser.add_argument("--network", choices=NETWORK_NAMES, help="flow (default), analytic, "
                        "ideal")
    parser.add_argument("--algo", default="auto", help="collective algorithm (default auto)")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="replay traces of a failed run too (marked incomplete: "
                        "meta.complete false); refused by default")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--trace", dest="out_trace", metavar="JSON",
                        help="write the replayed timed trace")
    parser.add_argument("--chrome", metavar="JSON", help="write a Chrome/Perfetto trace "
                        "(gzipped when it ends in .gz)")


def run(args: argparse.Namespace) -> int:
    algo = parse_algorithm(args.algo)
    network = None if args.network is None else NetworkMode(args.network)
    inputs = trace_files(Path(args.trace))
    profile_flag(args.profile, inputs)
    targets = check_outputs({"--trace": args.out_trace, "--chrome": args.chrome}, inputs=inputs)
    profile = load_profile(args.profile) if args.profile else None
    loaded = load_trace(args.trace, allow_incomplete=args.allow_incomplete)
    spec = choose_cluster(loaded.trace, args.cluster, nodes=args.nodes, fabric=args.fabric)
    cluster = spec.build()
    if profile is not None:  # its measured link classes and roofs replace the preset's
        cluster = profile.applied_to(cluster)
    with Outputs(targets.values()) as outputs:
        with ProgressBar("replay", "op") as bar:
            result = replay_trace(loaded, cluster, profile, retime=args.retime,
                                  network=network, algo=algo, progress=bar.progress,
                                  host_gaps=not args.no_host_gaps)
        if args.retime and result.uncosted_compute:
            warn(f"--retime: {result.uncosted_compute} of "
                 f"{result.uncosted_compute + result.retimed_compute} compute ops kept their "
                 "measured durations: the trace states no FLOPs or bytes for them (a "
                 "profiler's ops carry none), so the compute model cannot time them")
        if targets:
            write_timed(outputs, targets, result.times.timed_trace())
        outputs.commit()
        if args.json:
            digest = (files_sha256(loaded.files) if loaded.path.is_dir()
                      else file_sha256(loaded.path))
            text = json.dumps({**summary_json(result), **provenance(result.profile, digest)},
                              allow_nan=False)
        else:
            text = summary_text(result)
        try:
            emit(text)  # inside the block: an error writing stdout removes the outputs
        except BrokenPipeError:  # the reader stopped early; the files are complete: keep them
            broken = True
        else:
            broken = False
    if broken:
        raise BrokenPipeError  # the command line silences stdout and exits 0
    return 0


def summary_json(r: ReplayResult) -> dict[str, Any]:
    """The `--json` object (without provenance): the headline figures first."""
    trace = r.loaded.trace
    return {
        "trace": str(r.loaded.path),
        "source": r.loaded.source,
        "cluster": r.cluster.name,
        "network": r.network,
        "algo": r.algo,
        "step_time_predicted_s": r.step_time_predicted_s,
        "step_time_measured_s": r.step_time_measured_s,
        "step_time_in_trace_s": r.step_time_in_trace_s,
        "trace_times": "predicted" if r.trace_predicted else "measured",
        "num_ranks": len(trace.ops),
        "num_ranks_mirrored": r.num_ranks_mirrored,
        "ops": {"by_kind": r.op_counts, "by_collective": r.collective_counts},
        "collective_bytes": r.collective_bytes,
        "kept_measured": {"compute": r.kept_measured_compute,
                          "communication": r.kept_measured_comm},
        "retimed_compute": r.retimed_compute,
        "kept_measured_compute": r.kept_measured_compute,
        "kept_measured_compute_no_flops_bytes": r.uncosted_compute,
        "host_gaps_s": r.host_gaps_s,
        "algorithms": dict(sorted(r.times.algorithms.items())),
        "files_skipped": list(r.loaded.skipped_files),
        "events_left_out": dropped(trace.meta.skipped),
    }


def _bytes(size: float) -> str:
    """Bytes for a human: 424 B, 212.5 kB, 306.7 MB (decimal, as nccl-tests prints sizes)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size:g} B"


def summary_text(r: ReplayResult) -> str:
    trace = r.loaded.trace
    ranks = len(trace.ops)
    partial = f", {r.num_ranks_mirrored} more mirrored" if r.num_ranks_mirrored else ""
    lines = [f"parasim replay: {r.loaded.source} trace of {ranks} rank{'s' * (ranks != 1)}"
             f"{partial} on {r.cluster.name}, profile {r.profile.name}, {r.network} network",
             f"  {'step time predicted':<24}{r.step_time_predicted_s:.4g} s"]
    if r.step_time_measured_s is not None:
        ratio = (f"  (predicted / measured {r.step_time_predicted_s / r.step_time_measured_s:.3g})"
                 if r.step_time_measured_s > 0 else "")
        lines.append(f"  {'step time measured':<24}{r.step_time_measured_s:.4g} s{ratio}")
    elif r.trace_predicted and r.step_time_in_trace_s is not None:
        lines.append(f"  {'step time in the trace':<24}{r.step_time_in_trace_s:.4g} s "
                     "(simulate's prediction, not a measurement)")
    kinds = ", ".join(f"{n} {kind}" for kind, n in r.op_counts.items())
    lines.append(f"  {'ops':<24}{kinds}")
    for name, n in r.collective_counts.items():
        lines.append(f"  {'  ' + name:<24}{n} x, {_bytes(r.collective_bytes[name])} in all")
    lines.append(f"  {'kept measured':<24}{r.kept_measured_compute} compute ops, "
                 f"{r.kept_measured_comm} communications of unstated size")
    if r.retimed_compute:
        lines.append(f"  {'timed by the model':<24}{r.retimed_compute} compute ops")
    if r.uncosted_compute:
        lines.append(f"  {'':<24}{r.uncosted_compute} measured compute ops state no FLOPs or "
                     "bytes (only their measured durations can time them)")
    if r.loaded.skipped_files:
        lines.append(f"  {'files left out':<24}{', '.join(r.loaded.skipped_files)} (not parasim "
                     "traces)")
    return "\n".join(lines)
