"""`parasim search CONFIG.toml [--gpus N] [--top K] [--workers N] [--ray ADDRESS] [--json]
[--report F]`: the command line's handler (its flags and its run; `sim.cli` dispatches).

    parasim search                                   # the shipped GPT-3 175B search
    parasim search my.toml --gpus 512 --top 8 --workers 2 --report search.html
    parasim search my.toml --ray auto --json         # on the Ray cluster of this machine
    parasim search my.toml --objective goodput       # also ranked by goodput over a run

The report is checked before the search starts and written all or none (`traces.files`);
progress (candidates done / total, the best step time so far) goes to stderr, only on a
terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from sim.commands.common import ProgressBar, emit
from sim.config import example_path
from sim.provenance import provenance
from sim.search.engines import default_workers, open_engine
from sim.search.goodput import OBJECTIVES, goodput_json, goodput_text, rank_by_goodput
from sim.search.output import result_json, result_text
from sim.search.problem import context, problem_from_dict
from sim.search.run import DEFAULT_TOP, search
from sim.settings import (
    add_set_flag,
    config_sha256,
    load_search_config,
    named_as_flags,
    parse_settings,
    search_tables,
)
from traces.files import Outputs, check_outputs

HELP = "rank layouts: analytic screen of a space, full simulation of the best, in parallel"
EXAMPLE = "gpt3-175b-1024-a100-search.toml"


class Bar(Protocol):
    """What the command needs of `sim.commands.common.ProgressBar` (a tqdm bar, drawn on a
    terminal)."""

    bar: Any

    def update(self, done: int, total: int) -> None: ...

    def __enter__(self) -> Bar: ...

    def __exit__(self, *exc: object) -> None: ...


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="TOML config with a [search] table "
                        "(default: the shipped GPT-3 175B on 1024 A100s)")
    parser.add_argument("--gpus", type=int, help="GPUs (sets [cluster] nodes)")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP,
                        help=f"candidates to simulate in full (default {DEFAULT_TOP})")
    parser.add_argument("--workers", type=int,
                        help="local worker processes (default: every core)")
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="run on a Ray cluster: auto, HOST:PORT or ray://HOST:PORT")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--report", metavar="HTML", help="write a plotly report")
    parser.add_argument("--objective", choices=OBJECTIVES, default="step_time",
                        help="rank the simulated layouts by step time (default) or also by "
                        "goodput: effective tokens/s over a run with failures")
    add_set_flag(parser)


def run(args: argparse.Namespace) -> int:
    config = Path(args.config) if args.config is not None else example_path(EXAMPLE)
    targets = check_outputs({"--report": args.report}, inputs=[config])
    settings = parse_settings(args.settings, search_tables())
    with named_as_flags(settings):
        problem = problem_from_dict(load_search_config(config, settings), name=config.stem,
                                    base=config.parent, gpus=args.gpus)
    workers = args.workers if args.workers is not None else default_workers()
    with Outputs(targets.values()) as outputs:
        with _Progress(ProgressBar) as progress, open_engine(workers, args.ray) as engine:
            result = search(problem, engine=engine, top_k=args.top, progress=progress.update)
        if "--report" in targets:
            from sim.search.report import render_search_report  # plotly only when asked

            outputs.write(targets["--report"], render_search_report(result))
        outputs.commit()
        extra_json, extra_text = _objective(args.objective, result, problem)
        emit(json.dumps({**result_json(result), **extra_json,
                         **provenance(context(problem).base.profile,
                                      config_sha256(config, settings))},
                        allow_nan=False) if args.json else result_text(result) + extra_text)
    return 0


def _objective(objective: str, result: Any, problem: Any) -> tuple[dict[str, Any], str]:
    """What `--objective goodput` adds to the output (nothing for step time, so the default
    output stays as it was)."""
    if objective != "goodput":
        return {}, ""
    rows = rank_by_goodput(result, context(problem))
    return goodput_json(rows), goodput_text(rows)


class _Progress:
    """One bar per tier ("screen", then "simulate"), the best step time so far beside it."""

    def __init__(self, make: Callable[[str, str], Bar]) -> None:
        self.make = make
        self.tier = ""
        self.bar: Bar | None = None

    def update(self, tier: str, done: int, total: int, best: float | None) -> None:
        if tier != self.tier:
            self.close()
            self.tier = tier
            self.bar = self.make(tier, "layout").__enter__()
        assert self.bar is not None
        if best is not None:
            self.bar.bar.set_postfix_str(f"best {best:.4g} s", refresh=False)
        self.bar.update(done, total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        if sys.stderr is not None:
            sys.stderr.flush()
