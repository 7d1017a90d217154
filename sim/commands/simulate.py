"""`parasim simulate`: predict one training step of a config, print it, write what was asked.

    parasim simulate [CONFIG.toml] [--json] [--report step.html] [--trace step.json]
                     [--chrome step.json.gz] [--network N] [--algo A] [--profile P] [--no-fold]
                     [--trace-ranks 0,8-15]

Output files are checked before the simulation starts and written all or none.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from typing import Any

from sim.commands.common import (
    UnitBars,
    config_path,
    emit,
    error,
    profile_flag,
    silence_stdout,
    write_timed,
)
from sim.commands.trace_ranks import add_trace_ranks_flag, keep_ranks, parse_ranks
from sim.config import example_path
from sim.engine.transport import NETWORK_NAMES
from sim.entry import keep_until_exit
from sim.metrics import StepSummary
from sim.provenance import provenance
from sim.report.timeline import annotate
from sim.settings import add_set_flag, config_sha256, load_set_experiment, parse_settings
from sim.simulate import predict, size_text, summary_json, summary_text
from traces.errors import ConfigError, show, warn
from traces.files import Outputs, check_outputs

HELP = "predict one training step of a config"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="TOML config (default: the shipped GPT-3 "
                        "175B on 1024 A100s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--report", metavar="HTML", help="write a plotly report")
    parser.add_argument("--trace", metavar="JSON", help="write the predicted timed trace")
    parser.add_argument("--chrome", metavar="JSON", help="write a Chrome/Perfetto trace "
                        "(gzipped when it ends in .gz)")
    parser.add_argument("--report-ranks", metavar="R,R", help="ranks whose lanes the report "
                        "details (default: the first and the last pipeline stage's)")
    parser.add_argument("--network", choices=NETWORK_NAMES, help="flow (default), analytic, "
                        "ideal")
    parser.add_argument("--algo", help="collective algorithm (default auto)")
    parser.add_argument("--profile", metavar="JSON", help="calibration profile")
    parser.add_argument("--no-fold", action="store_true",
                        help="simulate every rank instead of one per pipeline stage")
    parser.add_argument("--fail-if-oom", action="store_true", help="exit 1 when the peak "
                        "memory of a rank exceeds the GPU's (after the output), for CI")
    add_set_flag(parser)
    add_trace_ranks_flag(parser)


def run(args: argparse.Namespace) -> int:
    config = config_path(args.config, example_path())
    inputs = [config]
    overrides: dict[str, Any] = {k: v for k, v in (("network", args.network),
                                                   ("algo", args.algo)) if v is not None}
    if (profile := profile_flag(args.profile, inputs)) is not None:
        overrides["profile"] = profile
    report_ranks = _ranks(args.report_ranks)
    if report_ranks is not None and args.report is None:
        raise ConfigError("--report-ranks: it chooses the ranks a report details; give "
                          "--report HTML too")
    settings = parse_settings(args.settings)
    exp = load_set_experiment(config, settings, overrides)
    if exp.profile_path is not None:  # [sim] profile is an input too: never written over
        inputs.append(exp.profile_path)
    trace_ranks = None
    if args.trace_ranks is not None:
        if args.trace is None and args.chrome is None:
            raise ConfigError("--trace-ranks: it chooses the ranks --trace and --chrome keep; "
                              "give one of them too")
        trace_ranks = parse_ranks(args.trace_ranks, exp.cluster.num_devices)
    # Fail before the (long) simulation, not after it.
    targets = check_outputs({"--trace": args.trace, "--chrome": args.chrome,
                             "--report": args.report}, inputs=inputs)
    for warning in exp.warnings:
        warn(warning)
    with Outputs(targets.values()) as outputs:
        with UnitBars("simulate", "ops replayed", "ranks planned") as bars:
            if shown := bars.shown():
                bars("rank", 0, None)  # from the start: choosing the ranks takes seconds too
            summary, times = predict(exp, fold=not args.no_fold,
                                     progress=partial(bars, "item") if shown else None,
                                     plan_progress=partial(bars, "rank") if shown else None)
        if "--trace" in targets or "--chrome" in targets:
            devices = exp.cluster.device_words[1]
            write_timed(outputs, targets, keep_ranks(annotate(
                times.timed_trace(), times, exp.model, exp.layout, devices,
                exp.cluster.devices_per_server, exp.cluster.accelerator.fp8_block_scaling),
                trace_ranks))
        if "--report" in targets:
            from sim.report import render_report  # plotly loads only when a report is asked for
            from sim.report.about import opening_comment

            outputs.write(targets["--report"], render_report(exp, summary, times, report_ranks,
                                                             opening_comment(config)))
        outputs.commit()
        text = (json.dumps({**summary_json(exp, summary),
                            **provenance(exp.profile, config_sha256(config, settings))},
                           allow_nan=False)
                if args.json else summary_text(exp, summary))
        try:
            emit(text)
        except BrokenPipeError:  # the reader stopped early; the files are complete: keep them
            silence_stdout()
    keep_until_exit(times)  # the step's plan and times: freed by the exit (`sim.entry`)
    return oom_status(summary) if args.fail_if_oom else 0


def oom_status(summary: StepSummary) -> int:
    """--fail-if-oom: 1 and one line when the fullest rank does not fit, else 0."""
    if summary.fits:
        return 0
    error(f"--fail-if-oom: peak memory {size_text(summary.peak_memory_bytes)} does not fit in "
          f"{size_text(summary.memory_capacity_bytes)}")
    return 1


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
