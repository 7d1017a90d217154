"""`parasim from-megatron "ARGS..."`: a Megatron-LM / Megatron-Bridge argument list printed as a
parasim TOML (`sim.frontdoors.megatron`).

    parasim from-megatron "$(cat train_args.txt)" --gpus 64 --cluster dgx-h100 > job.toml
    parasim from-megatron "model.tensor_model_parallel_size=4 ..." --model hf:config.json ...

The TOML goes to stdout; every argument it cannot express is named in one warning line on
stderr. The TOML is checked as `simulate` would read it before it is printed.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from typing import Any

from sim.commands.common import emit
from sim.config import experiment_from_dict
from sim.frontdoors.megatron import REQUIRED, finish, translate
from sim.frontdoors.model_source import FROM, flag_table
from topology.config import read_cluster
from topology.presets import PRESETS
from traces.errors import ConfigError, show, warn

HELP = "print a parasim TOML for a Megatron-LM / Megatron-Bridge argument list"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs="+", metavar="ARGS", help="the arguments, quoted as one "
                        "word or several (Megatron-LM flags, or Bridge overrides a.b_c=V); "
                        "or unquoted after --")
    parser.add_argument("--gpus", type=int, help="the world size (default: torchrun's "
                        "--nnodes x --nproc-per-node among ARGS)")
    parser.add_argument("--cluster", default="dgx-h100", help="the preset the TOML names "
                        "(default dgx-h100)")
    parser.add_argument("--model", metavar="hf:PATH", help="take [model] from a Hugging Face "
                        "config.json; the arguments' model flags go on top")


def run(args: argparse.Namespace) -> int:
    if args.cluster not in PRESETS:
        raise ConfigError(f"--cluster: {show(args.cluster)} is not one of "
                          f"{', '.join(PRESETS)}")
    if args.gpus is not None and not 1 <= args.gpus <= 131_072:
        raise ConfigError(f"--gpus: {args.gpus} must be from 1 to 131,072")
    out = finish(translate(args.args), args.gpus)
    model = out.model
    if args.model is not None:
        model = {FROM: flag_table({}, args.model)[FROM], **model}
    else:
        missing = [key for key in REQUIRED if key not in model]
        if missing:
            raise ConfigError(f"[model]: the arguments do not give {', '.join(missing)} (Megatron "
                              "takes the vocabulary from the tokenizer: add --vocab-size N, or "
                              "give --model hf:PATH/config.json)")
    per_node = read_cluster({"preset": args.cluster}).devices_per_server
    world = out.parallel["dp"] * out.parallel.get("tp", 1) * out.parallel.get("cp", 1) * \
        out.parallel.get("pp", 1)
    if world % per_node:
        raise ConfigError(f"--gpus: {world} GPUs do not fill whole {args.cluster} nodes of "
                          f"{per_node}")
    text = toml_text({"model": model, "parallel": out.parallel,
                      "cluster": {"preset": args.cluster, "nodes": world // per_node}})
    experiment_from_dict(tomllib.loads(text), base=Path.cwd())  # refused here, not later
    if out.left_out:
        warn(f"from-megatron: cannot express, left out: {'; '.join(out.left_out)}")
    emit(text)
    return 0


def toml_text(tables: dict[str, dict[str, Any]]) -> str:
    """The tables as TOML: strings quoted as JSON does (TOML's basic strings), booleans lower."""
    lines = ["# written by parasim from-megatron"]
    for name, table in tables.items():
        lines += ["", f"[{name}]"]
        lines += [f"{key} = {_value(value)}" for key, value in table.items()]
    return "\n".join(lines)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)
