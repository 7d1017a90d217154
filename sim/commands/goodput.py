"""`parasim goodput`: a whole training run with failures, checkpoints and restarts.

    parasim goodput [CONFIG.toml] [--days D | --tokens N] [--json] [--report F.html]
                    [--runs N] [--seed S] [--profile P]

Simulates one step (`sim.simulate.predict`), then the run: the job's mean time to
interruption from its components, the checkpoint's size, write and the restart, Daly's and
Young's intervals, and a seeded Monte-Carlo of the whole run (`sim.goodput`). The report is
checked before the work starts and written all or none.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from typing import Any

from sim.commands.common import ProgressBar, config_path, emit, profile_flag
from sim.config import example_path
from sim.goodput.montecarlo import check_events, simulate_run
from sim.goodput.outputs import goodput_json
from sim.goodput.plan import plan_run, target_tokens
from sim.goodput.settings import MAX_RUNS, reliability_or_default
from sim.goodput.text import goodput_text
from sim.provenance import provenance
from sim.settings import add_set_flag, config_sha256, load_set_experiment, parse_settings
from sim.simulate import predict
from traces.errors import ConfigError, show, warn
from traces.files import Outputs, check_outputs

HELP = "a whole run with failures, checkpoints and restarts: wall time, goodput"
EXAMPLE = "llama3-405b-16k-h100-goodput.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="TOML config, optionally with "
                        "[reliability] (default: the shipped 405B on 16,384 H100s)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--days", type=_number("--days"), help="the target: the tokens D "
                        "days of failure-free training process (default 30)")
    target.add_argument("--tokens", type=_number("--tokens"), help="the target in tokens")
    parser.add_argument("--runs", type=int, help="Monte-Carlo runs (default [reliability] "
                        "runs, 200)")
    parser.add_argument("--seed", type=int, help="Monte-Carlo seed (default [reliability] "
                        "seed, 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--report", metavar="HTML", help="write a plotly report")
    parser.add_argument("--profile", metavar="JSON", help="calibration profile")
    add_set_flag(parser)


def _number(flag: str) -> Any:
    """A finite number (argparse names the flag in its message: "argument --days: ...")."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{show(text)} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{show(text)} is not a finite number")
        return value
    return parse


def run(args: argparse.Namespace) -> int:
    config = config_path(args.config, example_path(EXAMPLE))
    inputs = [config]
    overrides: dict[str, Any] = {}
    if (profile := profile_flag(args.profile, inputs)) is not None:
        overrides["profile"] = profile
    settings = parse_settings(args.settings)
    exp = load_set_experiment(config, settings, overrides)
    if exp.profile_path is not None:
        inputs.append(exp.profile_path)
    exp = replace(exp, reliability=_flags(reliability_or_default(exp.reliability), args))
    targets = check_outputs({"--report": args.report}, inputs=inputs)
    for warning in exp.warnings:
        warn(warning)
    with Outputs(targets.values()) as outputs:
        with ProgressBar("simulate", "op") as bar:
            summary, _ = predict(exp, progress=bar.progress)
        plan = plan_run(exp, summary, target=target_tokens(args.days, args.tokens,
                                                           summary.tokens_per_s))
        check_events(plan.model, plan.runs, plan.expected_wall_s)
        outcome = simulate_run(plan.model, runs=plan.runs, seed=plan.seed)
        if "--report" in targets:
            from sim.goodput.report import render_goodput_report  # plotly only when asked

            outputs.write(targets["--report"], render_goodput_report(plan, outcome))
        outputs.commit()
        emit(json.dumps({**goodput_json(plan, outcome),
                         **provenance(exp.profile, config_sha256(config, settings))},
                        allow_nan=False)
             if args.json else goodput_text(plan, outcome))
    return 0


def _flags(rel: Any, args: argparse.Namespace) -> Any:
    """--runs and --seed over the config's values, bounded as the config's are."""
    if args.runs is not None and not 1 <= args.runs <= MAX_RUNS:
        raise ConfigError(f"--runs: {args.runs} must be an integer from 1 to {MAX_RUNS:,}")
    if args.seed is not None and not 0 <= args.seed < 2**32:
        raise ConfigError(f"--seed: {args.seed} must be an integer from 0 to {2**32 - 1:,}")
    return replace(rel, runs=args.runs if args.runs is not None else rel.runs,
                   seed=args.seed if args.seed is not None else rel.seed)

