"""`parasim sweep KEY VALUE [VALUE...]`: simulate a config once per value of one key (`sim.sweep`).

    parasim sweep parallel.micro_batch 1 2 4 --report sweep.html
    parasim sweep parallel.tp 2 4 8 --config my.toml --set parallel.pp=4 --json

The report is checked before anything is simulated and written all or none.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from sim.commands.common import config_path, emit, profile_flag, progress_over
from sim.config import example_path
from sim.provenance import provenance
from sim.settings import add_set_flag, config_sha256, parse_settings
from sim.simulate import predict
from sim.sweep.points import (
    MAX_VALUES,
    Point,
    sweep_experiments,
    sweep_json,
    sweep_settings,
    sweep_text,
)
from traces.errors import warn
from traces.files import Outputs, check_outputs

HELP = "simulate a config once per value of one key: a table and a plot"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", metavar="KEY", help="the key to sweep, SECTION.KEY as --set "
                        "names it (e.g. parallel.micro_batch)")
    parser.add_argument("values", metavar="VALUE", nargs="+", help=f"its values, 1 to "
                        f"{MAX_VALUES}, each as --set reads a value")
    parser.add_argument("--config", metavar="TOML", help="the config (default: the shipped "
                        "GPT-3 175B on 1024 A100s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--report", metavar="HTML", help="write a plotly report")
    parser.add_argument("--profile", metavar="JSON", help="calibration profile")
    add_set_flag(parser)


def run(args: argparse.Namespace) -> int:
    config = config_path(args.config, example_path())
    inputs = [config]
    overrides: dict[str, Any] = {}
    if (profile := profile_flag(args.profile, inputs)) is not None:
        overrides["profile"] = profile
    settings = parse_settings(args.settings)
    swept = sweep_settings(args.key, args.values)
    exps = sweep_experiments(config, settings, swept, overrides)
    inputs += [e.profile_path for e in exps[:1] if e.profile_path is not None]
    targets = check_outputs({"--report": args.report}, inputs=inputs)
    for warning in dict.fromkeys(w for e in exps for w in e.warnings):
        warn(warning)
    with Outputs() as outputs:
        points = [Point(value=s.value, exp=e, summary=predict(e)[0])
                  for e, s in progress_over(list(zip(exps, swept)), "sweep")]
        if "--report" in targets:
            from sim.sweep.report import render_sweep_report  # plotly only when asked

            outputs.write(targets["--report"], render_sweep_report(args.key, points))
        outputs.commit()
        emit(json.dumps({**sweep_json(args.key, points),
                         **provenance(exps[0].profile, config_sha256(config, settings))},
                        allow_nan=False) if args.json else sweep_text(args.key, points))
    return 0
