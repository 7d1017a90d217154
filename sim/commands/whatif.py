"""The `parasim whatif` command: a captured step predicts another job's step.

    parasim whatif TRACE... [--config target.toml] [--set parallel.dp=4 ...] [--job job.toml]
                   [--profile P] [--statistic load|mean|median|share]
                   [--links auto|cluster|capture] [--json]

TRACE is a `parasim run` trace set (a folder) or file; several are repeated captures of one
job, pooled. The target is `--config`, else the captured job (its trace header's model,
layout and cluster), with each `--set` over it. The output says which kernels kept their
measured times and which were extrapolated, how far (shape ratio) and with what
uncertainty, and a range [low, high] (`sim.whatif`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from sim.commands.common import emit, profile_flag, trace_files
from sim.settings import add_set_flag, parse_settings
from sim.whatif import WhatifResult, load_captured, target_experiment, whatif
from sim.whatif.book import Statistic
from sim.whatif.links import LearnedLinks
from traces.errors import warn

HELP = "predict another job's step from a captured one, with an error bar"
RANGE_COVERS = ("the extrapolated kernels' uncertainty; not the communication model's, nor "
                "the host's load")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("traces", metavar="TRACE", nargs="+", help="a `parasim run` folder "
                        "or trace file; several: repeated captures of one job")
    parser.add_argument("--config", metavar="TOML", help="the target job (default: the "
                        "captured job, with --set over it)")
    parser.add_argument("--job", metavar="TOML", help="the captured job, for traces whose "
                        "header does not state it")
    parser.add_argument("--profile", metavar="JSON", help="calibration profile: the target "
                        "cluster's measured links and roofs, as `replay --profile` applies it, "
                        "and the figures that time kernel classes the capture never ran")
    parser.add_argument("--statistic", choices=[str(s) for s in Statistic], default="load",
                        help="what stands for a shape's measured times: load (default: its "
                        "median times the capture's load factor, so the captured total "
                        "stays), mean, median (an idle host's figure), or share (the median, "
                        "and the step no shorter than each rank's CPU work over its share "
                        "of a core)")
    parser.add_argument("--links", choices=("auto", "cluster", "capture"), default="auto",
                        help="what times the target's new communication: the target "
                        "cluster's link figures, or figures fitted to the capture's own "
                        "collectives and its link probe (all-reduces at several sizes); "
                        "auto (default): capture where it holds the probe (docs/whatif.md)")
    parser.add_argument("--stragglers", choices=("auto", "on", "off"), default="auto",
                        help="new ranks' collectives wait for the member the host preempted "
                        "last, from the capture's kernel-time spread; auto (default): where "
                        "both hosts state their cores and the statistic is load or mean")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_set_flag(parser)


def run(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    inputs = [f for t in args.traces for f in trace_files(Path(t))]
    profile_path = profile_flag(args.profile, inputs)
    captured = load_captured(args.traces, args.job)
    overrides = {"profile": profile_path} if profile_path else None
    exp = target_experiment(captured, args.config, parse_settings(args.settings), overrides)
    result = whatif(captured, exp, exp.profile if exp.profile_path is not None else None,
                    Statistic(args.statistic),
                    capture_links=None if args.links == "auto" else args.links == "capture",
                    stragglers=None if args.stragglers == "auto" else args.stragglers == "on")
    if result.captured_on != exp.cluster.accelerator.name:
        warn(f"kernel times are the capture's on {result.captured_on}, not re-timed for the "
             f"target's {exp.cluster.accelerator.name} (as `replay --cluster` keeps them)")
    seconds = time.perf_counter() - began
    emit(json.dumps(summary_json(result, seconds), allow_nan=False) if args.json
         else summary_text(result))
    return 0


def summary_json(r: WhatifResult, seconds: float | None = None) -> dict[str, Any]:
    """The `--json` object: the headline first, then each kernel class apart."""
    out: dict[str, Any] = {
        "target": r.exp.name,
        "cluster": r.exp.cluster.name,
        "kernels_timed_on": r.captured_on,
        "statistic": str(r.statistic),
        "step_time_predicted_s": r.step_time_s,
        "step_time_range_s": [r.low_s, r.high_s],
        "range_covers": RANGE_COVERS,
        "step_time_captured_s": r.captured_step_s,
        "ranks_simulated": r.ranks,
        "ranks_as_captured": r.ranks_kept,
        "compute_ops_by_source": dict(sorted(r.ops_by_source.items())),
        "measured_kernels": [k.name for k in r.kernels if not k.extrapolated],
        "extrapolated_kernels": {k.name: {"ops": k.sources, "shape_ratio": k.ratio,
                                          "uncertainty": k.uncertainty}
                                 for k in r.kernels if k.extrapolated},
    }
    if r.links is not None:
        out["links_fitted_to_capture"] = links_json(r.links)
        out["communication_ops_by_source"] = dict(sorted(r.communication_by_source.items()))
    if r.time_shared != 1.0:
        out["host_work_time_shared"] = r.time_shared
    if r.straggle_s:
        out["stragglers"] = {"preemptions_per_s": r.straggle.rate,
                             "slice_s": r.straggle.slice_s, "waits_s": r.straggle_s}
    if seconds is not None:
        out["whatif_seconds"] = seconds
    return out


def links_json(links: LearnedLinks) -> dict[str, Any]:
    """The link figures the capture's communication gave, and what it left unpinned."""
    return {"samples": links.samples, "rms_error": links.rms_error,
            "unidentified": list(links.unidentified),
            "links": {k: {"bandwidth_Bps": bw, "latency_s": lat, "call_s": call}
                      for k, (bw, lat, call) in sorted(links.figures.items())},
            "measured_probe": None if links.probe is None else {
                "ranks": links.probe.ranks, "links": sorted(links.probe.links),
                "all_reduce_mean_s": {str(int(b)): t for b, t in links.probe.means}}}


def summary_text(r: WhatifResult) -> str:
    ranks = f"{r.ranks} rank{'s' * (r.ranks != 1)} simulated"
    if r.ranks_kept:
        ranks += f", {r.ranks_kept} as captured (their own times)"
    lines = [f"parasim whatif: {r.exp.name} on {r.exp.cluster.name} ({ranks})",
             f"  {'step time predicted':<24}{r.step_time_s:.4g} s  "
             f"[{r.low_s:.4g}, {r.high_s:.4g}]",
             f"  {'':<24}(the range: {RANGE_COVERS})"]
    if r.captured_step_s is not None:
        lines.append(f"  {'step time captured':<24}{r.captured_step_s:.4g} s")
    if r.links is not None:
        figures = ", ".join(f"{k} {lat * 1e6:.4g} µs + {call * 1e6:.4g} µs/call, "
                            f"{bw / 1e9:.3g} GB/s" for k, (bw, lat, call) in
                            sorted(r.links.figures.items()))
        lines.append(f"  {'links (capture fit)':<24}{figures} ({r.links.samples} measured; "
                     f"not pinned down: {', '.join(r.links.unidentified) or 'none'})")
        if r.links.probe is not None:
            sizes = ", ".join(f"{int(b)} B {t * 1e3:.3g} ms" for b, t in r.links.probe.means)
            lines.append(f"  {'measured (probe)':<24}all-reduce over {r.links.probe.ranks} "
                         f"ranks ({', '.join(sorted(r.links.probe.links))}): {sizes}")
        if r.communication_by_source:
            by = ", ".join(f"{n} {s}" for s, n in sorted(r.communication_by_source.items()))
            lines.append(f"  {'communication ops':<24}{by}")
    if r.time_shared != 1.0:
        lines.append(f"  {'host cores shared':<24}kernels and host gaps x{r.time_shared:.3g} "
                     f"(the target's ranks per core over the capture's)")
    if r.straggle_s:
        lines.append(f"  {'stragglers':<24}{r.straggle_s * 1e3:.4g} ms of waits for the last "
                     f"member ({r.straggle.rate:.3g} preemptions/s of "
                     f"{r.straggle.slice_s * 1e3:.3g} ms each)")
    sources = ", ".join(f"{n} {s}" for s, n in sorted(r.ops_by_source.items()))
    lines.append(f"  {'compute ops':<24}{sources}")
    measured = [k.name for k in r.kernels if not k.extrapolated]
    if measured:
        lines.append(f"  {'measured kernels':<24}{', '.join(measured)}")
    extrapolated = [k for k in r.kernels if k.extrapolated]
    if extrapolated:
        lines.append(f"  {'extrapolated kernels':<24}shape ratio, uncertainty")
        for k in extrapolated:
            how = "+".join(s for s in k.sources if s not in ("own", "measured"))
            lines.append(f"  {'  ' + k.name:<24}x{k.ratio:.3g} {how}, "
                         f"±{100 * k.uncertainty:.3g}%")
    return "\n".join(lines)
