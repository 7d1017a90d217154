"""`parasim export`: a config's step as MLCommons Chakra execution traces, for ASTRA-sim and
Chakra's tools (and for `parasim replay DIR`, which reads them back exactly).

    parasim export --chakra DIR [--config CONFIG.toml] [--name NAME] [--set K=V] [--profile P]
                   [--network N] [--algo A] [--no-fold] [--json]

Builds and simulates the plan as `simulate` does, then writes `DIR/NAME.<rank>.et` per rank
(`traces.chakra_write`; compute durations are the simulated ones) and `DIR/comm_group.json`.
Folded by default (one rank per pipeline stage, which parasim replays by symmetry); `--no-fold`
writes every rank, as ASTRA-sim needs. Needs the `chakra` extra (protobuf). The files are
written all or none; a DIR holding another export's Chakra files is refused.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from sim.commands.common import ProgressBar, config_path, emit, profile_flag
from sim.config import example_path
from sim.engine.transport import NETWORK_NAMES
from sim.settings import add_set_flag, load_set_experiment, parse_settings
from sim.simulate import predict
from traces.chakra_read import et_files
from traces.chakra_schema import CHAKRA_COMMIT, messages
from traces.chakra_write import GROUPS_FILE, encode_trace, et_name, groups_json, process_groups
from traces.errors import ConfigError, show
from traces.files import Outputs, check_outputs

HELP = "write a config's step as Chakra execution traces (for ASTRA-sim)"
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chakra", metavar="DIR", required=True,
                        help="folder to write NAME.<rank>.et and comm_group.json into")
    parser.add_argument("--config", help="TOML config (default: the shipped GPT-3 175B on "
                        "1024 A100s)")
    parser.add_argument("--name", help="the files' name before .<rank>.et (default: the "
                        "config's file name)")
    parser.add_argument("--profile", metavar="JSON", help="calibration profile")
    parser.add_argument("--network", choices=NETWORK_NAMES, help="flow (default), analytic, "
                        "ideal")
    parser.add_argument("--algo", help="collective algorithm (default auto)")
    parser.add_argument("--no-fold", action="store_true", help="write every rank, not one "
                        "per pipeline stage (ASTRA-sim needs every rank)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_set_flag(parser)


def run(args: argparse.Namespace) -> int:
    messages()  # without protobuf: one line now, before the simulation
    config = config_path(args.config, example_path())
    inputs = [config]
    overrides: dict[str, Any] = {k: v for k, v in (("network", args.network),
                                                   ("algo", args.algo)) if v is not None}
    if (profile := profile_flag(args.profile, inputs)) is not None:
        overrides["profile"] = profile
    name = _name(args.name, config)
    folder = _folder(args.chakra, name)
    exp = load_set_experiment(config, parse_settings(args.settings), overrides)
    with ProgressBar("export", "op") as bar:
        summary, times = predict(exp, fold=not args.no_fold, progress=bar.progress)
    trace = times.timed_trace()
    targets = check_outputs({f"--chakra ({et_name(name, r)})": str(folder / et_name(name, r))
                             for r in trace.ranks}, inputs=inputs)
    stale = sorted(set(et_files(folder).values()) - set(targets.values()))
    if stale:
        raise ConfigError(f"--chakra: {folder} holds {stale[0].name}, which this export would "
                          "not replace; give an empty folder")
    written = 0
    with Outputs(targets.values()) as outputs:
        for rank, data in encode_trace(trace):
            outputs.write(folder / et_name(name, rank), data)
            written += len(data)
        groups = groups_json(process_groups(trace))
        outputs.write(folder / GROUPS_FILE, groups)
        outputs.commit()
    nodes = trace.num_ops()
    if args.json:
        emit(json.dumps({"folder": str(folder), "name": name, "ranks": trace.ranks,
                         "folded": trace.meta.fold is not None, "nodes": nodes,
                         "bytes": written + len(groups), "step_time_s": summary.step_time_s,
                         "chakra_schema": f"mlcommons/chakra@{CHAKRA_COMMIT}"},
                        allow_nan=False))
    else:
        folded = " (folded: one rank per pipeline stage)" if trace.meta.fold else ""
        emit(f"parasim export: {len(trace.ranks)} Chakra ET files{folded}, {nodes:,} nodes, "
             f"{written + len(groups):,} bytes in {folder}\n"
             f"  step time simulated {summary.step_time_s:.4g} s "
             f"(parasim replay {folder} gives it back)")
    return 0


def _name(given: str | None, config: Path) -> str:
    """--name, or the config's stem where that makes a plain file name, else 'trace'."""
    if given is None:
        return config.stem if _NAME.fullmatch(config.stem) else "trace"
    if not _NAME.fullmatch(given):
        raise ConfigError(f"--name: {show(given)} is not a plain file name (letters, digits, "
                          "_ - and ., at most 100)")
    return given


def _folder(text: str, name: str) -> Path:
    """--chakra DIR: made if absent (its parent must exist); a folder holding Chakra files
    of another name is refused before the simulation."""
    if not text:
        raise ConfigError("--chakra: an empty path names no folder")
    folder = Path(text)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--chakra: {folder} is not a folder")
    if not folder.exists():
        if not folder.parent.is_dir():
            raise ConfigError(f"--chakra: directory {folder.parent} does not exist")
        try:
            folder.mkdir()
        except OSError as err:
            raise ConfigError(f"--chakra: {folder}: {err.strerror or err}") from None
    other = sorted(p.name for p in et_files(folder).values()
                   if not p.name.startswith(f"{name}."))
    if other:
        raise ConfigError(f"--chakra: {folder} holds {other[0]} of another export; give an "
                          "empty folder")
    return folder
