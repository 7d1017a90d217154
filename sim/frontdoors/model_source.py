"""Where a config's `[model]` comes from: its own keys, or a Hugging Face config.json under them.

    [model]
    from = "hf:llama/config.json"    # relative to the TOML file
    seq_len = 8192                   # the table's own keys win over the file's

    parasim simulate run.toml --model hf:llama/config.json

`[model] from` reads the file, then lays the table's other keys over it. The `--model` flag is
the stronger word: it replaces every key a config.json decides (`hf.ARCH_KEYS`) and keeps the
config's training keys (seq_len, dtype, attention, kernels, routing options); `--set model.K=V`
still applies after it. Unknown fields of the file are named in one warning line.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from sim.frontdoors.hf import ARCH_KEYS, read_hf
from traces.errors import ConfigError, show, warn

PREFIX = "hf:"
FROM = "from"
"""The `[model]` key that names a source."""


def source_path(value: object, where: str, base: Path) -> Path:
    """The file an `hf:PATH` source names, relative to `base`; anything else is one line."""
    if not isinstance(value, str) or not value.startswith(PREFIX) or not value[len(PREFIX):]:
        raise ConfigError(f"{where}: {show(value)} must be \"hf:PATH\" (a Hugging Face "
                          "config.json)")
    return base / value[len(PREFIX):]


def flag_table(model: object, value: str) -> dict[str, Any]:
    """The `[model]` table with `--model VALUE` in force: the config's keys that a config.json
    does not decide, and `from` naming the file (made absolute: the flag's path is the shell's)."""
    path = source_path(value, "--model", Path.cwd())
    kept = {k: v for k, v in model.items() if k not in ARCH_KEYS and k != FROM} \
        if isinstance(model, Mapping) else {}
    return {**kept, FROM: f"{PREFIX}{path.absolute()}"}


def resolve_model(data: Mapping[str, Any], base: Path) -> Mapping[str, Any]:
    """`data` with a `[model] from` replaced by the keys it names (module docstring); `data`
    itself where its [model] names no source."""
    model = data.get("model")
    if not isinstance(model, Mapping) or FROM not in model:
        return data
    read = read_hf(source_path(model[FROM], "model.from", base))
    table = {**read.table, **{k: v for k, v in model.items() if k != FROM}}
    seq_len = table["seq_len"]
    if read.window and isinstance(seq_len, int) and seq_len > read.window:
        raise ConfigError(f"{model[FROM]}: cannot express sliding_window = {read.window} "
                          f"shorter than model.seq_len = {seq_len} (parasim's attention "
                          "spans the whole sequence)")
    if read.unknown:
        _warn_once(f"{model[FROM]}: fields parasim does not know, left out: "
                   f"{', '.join(read.unknown)}")
    return {**data, "model": table}


@cache
def _warn_once(message: str) -> None:
    """A warning printed once a process, however many experiments read the file (a sweep)."""
    warn(message)
