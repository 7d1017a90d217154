"""The `parasim` command line (also `python -m sim`): parses, dispatches, turns errors into lines.

    parasim collective --cluster dgx-h100 --nodes 16 --op all_reduce --sizes 1M:4G --json
    parasim simulate [CONFIG.toml] [--json] [--report step.html] [--trace step.json]
    parasim replay TRACE [--cluster PRESET_OR_TOML] [--nodes N] [--profile P] [--retime] [--json]
    parasim search [CONFIG.toml] [--gpus N] [--top K] [--workers N] [--ray ADDRESS] [--json]
    parasim run [CONFIG.toml] --out DIR [--steps N] [--warmup N] [--timeout S] [--kernels] [--json]
    parasim calibrate [DIR...] -o PROFILE.json [--run CLUSTER_OR_CONFIG] [--json]
    parasim validate [CONFIG.toml] [--profile P] [--report F.html] [--json]
    parasim goodput [CONFIG.toml] [--days D | --tokens N] [--report F.html] [--json]

Each command is a module of `sim.commands` with the same shape: `HELP`, `add_arguments(parser)`
and `run(args) -> exit status`. `--json` prints one JSON object on stdout and nothing else. A
user's mistake prints one line on stderr and exits with status 2; Ctrl-C prints one line and
exits with 130 (SIGTERM: one line, 143, cleaned up alike: `sim.entry`). Output files are
checked before the work starts and written all or none
(`traces.files.Outputs`). Only `run`, `calibrate --run` and `validate` reach the executor, lazily.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from sim.commands import (
    calibrate,
    collective,
    goodput,
    replay,
    run,
    search,
    simulate,
    validate,
)
from sim.commands.common import error, silence_stdout
from sim.provenance import parasim_version
from traces.errors import ConfigError, Fault, Terminated

COMMANDS = {"collective": collective, "simulate": simulate, "replay": replay, "run": run,
            "search": search, "calibrate": calibrate, "validate": validate, "goodput": goodput}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a ConfigError (one line, exit 2) instead of usage."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stdout is None:  # started with stdout closed (`>&-`): print() would drop everything
        error("stdout is closed; parasim prints its results there")
        return 2
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        return int(COMMANDS[args.command].run(args))
    except ConfigError as err:
        error(str(err))
        return 2
    except Fault as err:
        error(str(err))
        return 1
    except Terminated as err:  # SIGTERM, SIGHUP (`sim.entry`): cleaned up as Ctrl-C is
        error(f"terminated by {err.name}")
        return 128 + err.signum
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except BrokenPipeError:  # the reader of our stdout stopped early (`| head`): not an error
        silence_stdout()
        return 0


def _build_parser() -> _Parser:
    parser = _Parser(prog="parasim", description="Simulate distributed LLM training steps.")
    parser.add_argument("--version", action="version", version=f"parasim {parasim_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, module in COMMANDS.items():
        module.add_arguments(commands.add_parser(name, help=module.HELP))
    return parser
