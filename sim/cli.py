"""The `parasim` command line (also `python -m sim`): parses, dispatches, turns errors into lines.

    parasim collective --cluster dgx-h100 --nodes 16 --op all_reduce --sizes 1M:4G --json
    parasim simulate [CONFIG.toml] [--json] [--report step.html] [--trace step.json]
    parasim replay TRACE [--cluster PRESET_OR_TOML] [--nodes N] [--profile P] [--retime] [--json]
    parasim search [CONFIG.toml] [--gpus N] [--top K] [--workers N] [--ray ADDRESS] [--json]
    parasim run [CONFIG.toml] --out DIR [--steps N] [--warmup N] [--timeout S] [--kernels] [--json]
    parasim calibrate [DIR...] -o PROFILE.json [--run CLUSTER_OR_CONFIG] [--json]
    parasim validate [CONFIG.toml] [--profile P] [--report F.html] [--json]
    parasim goodput [CONFIG.toml] [--days D | --tokens N] [--report F.html] [--json]
    parasim sweep KEY VALUE [VALUE...] [--config F.toml] [--set K=V] [--report F.html] [--json]
    parasim export --chakra DIR [--config F.toml] [--no-fold] [--json]
    parasim from-megatron "ARGS..." [--gpus N] [--cluster PRESET] [--model hf:PATH]
    parasim whatif TRACE... [--config F.toml] [--set K=V] [--job JOB.toml] [--json]

Bare `parasim` prints the commands, each with one example (`sim.commands.overview`); each command's
`--help` ends with its example.

Each command is a module of `sim.commands` with the same shape: `HELP`, `add_arguments(parser)`
and `run(args) -> exit status`. `--json` prints one JSON object on stdout and nothing else. A
user's mistake prints one line on stderr and exits with status 2; Ctrl-C prints one line and
exits with 130 (SIGTERM: one line, 143, cleaned up alike: `sim.entry`). Output files are
checked before the work starts and written all or none
(`traces.files.Outputs`). Only `run`, `calibrate --run` and `validate` reach the executor, lazily.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from sim.commands.common import emit, error, silence_stdout
from sim.commands.overview import epilog, overview
from sim.provenance import parasim_version
from traces.errors import ConfigError, Fault, Terminated
from traces.files import removed_note

COMMANDS = ("collective", "simulate", "replay", "run", "search", "calibrate", "validate",
            "goodput", "sweep", "export", "from-megatron", "whatif")
"""The commands, in the order `--help` lists them: each the module `sim.commands.<name>`."""


def command(name: str) -> ModuleType:
    """The module of command `name`, imported when first asked for: `parasim simulate` need
    not load the search, calibration and goodput machinery (a tenth of its start-up)."""
    return importlib.import_module(f"sim.commands.{name.replace('-', '_')}")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a ConfigError (one line, exit 2) instead of usage."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stdout is None:  # started with stdout closed (`>&-`): print() would drop everything
        error("stdout is closed; parasim prints its results there")
        return 2
    try:
        if not (sys.argv[1:] if argv is None else argv):
            emit(overview({name: command(name).HELP for name in COMMANDS}, parasim_version()))
            return 0
        parser = _build_parser(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(argv)
        return int(command(args.command).run(args))
    except ConfigError as err:
        error(str(err) + removed_note(err))
        return 2
    except Fault as err:
        error(str(err) + removed_note(err))
        return 1
    except Terminated as err:  # SIGTERM, SIGHUP (`sim.entry`): cleaned up as Ctrl-C is
        error(f"terminated by {err.name}{removed_note(err)}")
        return 128 + err.signum
    except KeyboardInterrupt as err:
        error(f"interrupted{removed_note(err)}")
        return 130
    except MemoryError:  # the machine's, not the input's: bounds and estimates come first
        error("out of memory: this machine cannot hold what the command builds; ask for a "
              "smaller input")
        return 1
    except BrokenPipeError:  # the reader of our stdout stopped early (`| head`): not an error
        silence_stdout()
        return 0


def _build_parser(words: Sequence[str] = ()) -> _Parser:
    """The parser of `words` (the command line without the program): with every command's
    arguments, or only the command's that `words` starts with (then nothing can parse them
    otherwise: its arguments come after its name, and everything else is refused the same)."""
    parser = _Parser(prog="parasim", description="Simulate distributed LLM training steps.")
    parser.add_argument("--version", action="version", version=f"parasim {parasim_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    named = words[0] if words and words[0] in COMMANDS else None
    for name in COMMANDS if named is None else (named,):
        module = command(name)
        module.add_arguments(commands.add_parser(
            name, help=module.HELP, epilog=epilog(name),
            formatter_class=argparse.RawDescriptionHelpFormatter))
    return parser
