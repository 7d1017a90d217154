"""`--set section.key=value`: a config key replaced on the command line, after the TOML is read.

    parasim simulate --set parallel.tp=4 --set model.dtype='"fp8"'
    parasim simulate --set model.dtype=fp8          # a bare word that is no TOML value: a string
    parasim goodput --set reliability.rates.gpu=2e-6

The value is read as a TOML value (`4`, `true`, `"fp8"`, `[1, 2]`, `"400Gb/s"`); a bare word that
is not one (`fp8`, `400Gb/s`) is taken as the string it spells. The section must be a table of
the config and the key one of that table's keys, checked here, before anything is read; the
value is checked by the config's own reader, and a mistake there is named as the flag. The
provenance of the output (`config_sha256`) covers the settings (`config_sha256` below), so two
results with equal provenance came from the same file and the same settings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config import MODEL_KEYS, PARALLEL_KEYS, SIM_KEYS, Experiment, experiment_from_dict
from sim.frontdoors.model_source import FROM, flag_table, source_path
from sim.goodput.settings import KEYS as RELIABILITY_KEYS
from sim.provenance import file_sha256
from topology.config import KEYS as CLUSTER_KEYS
from traces.errors import ConfigError, show
from traces.files import load_toml

MAX_SETTINGS = 64
"""The most `--set` flags one command takes."""
MAX_VALUE_CHARS = 4096
"""The longest value one `--set` takes (a list of a few hundred numbers)."""
MAX_DEPTH = 4
"""The most names in a key (`reliability.rates.gpu` has three)."""
CONFIG_KEYS: Mapping[str, Sequence[str]] = {
    "model": (*MODEL_KEYS, FROM), "parallel": PARALLEL_KEYS, "cluster": CLUSTER_KEYS,
    "sim": SIM_KEYS, "reliability": RELIABILITY_KEYS}
"""The keys of each table a config may hold, as `sim.config` reads them."""
EXAMPLE = "--set parallel.tp=4"


@dataclass(frozen=True)
class Setting:
    """One `--set`: the key's names (`("parallel", "tp")`), the value read, and the flag's
    text as given (for the error lines that name it)."""

    path: tuple[str, ...]
    value: Any
    text: str

    @property
    def key(self) -> str:
        return ".".join(self.path)


class ModelFlag(str):
    """The value of `--model hf:PATH`, kept among the `--set` texts (it is one more setting:
    the whole [model] table's, applied before them: `sim.frontdoors.model_source`)."""


class _ModelAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []),
                                       ModelFlag(values)])


def add_set_flag(parser: argparse.ArgumentParser, hf_model: bool = True) -> None:
    """The repeatable `--set SECTION.KEY=VALUE` flag, and `--model hf:PATH` (where the command
    reads a [model]: `hf_model`)."""
    if hf_model:
        parser.add_argument("--model", action=_ModelAction, dest="settings", default=[],
                            metavar="hf:PATH",
                            help="the model of a Hugging Face config.json (Llama, Mistral, "
                            "Mixtral, Qwen2/3, DeepSeek-V2/V3) in place of the config's "
                            "[model] (its seq_len, dtype and attention stay)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        dest="settings", help="replace a config key after reading the TOML "
                        "(repeatable; the value is TOML, or a bare word as a string), e.g. "
                        "--set parallel.tp=4 --set model.dtype=fp8")


def parse_settings(texts: Sequence[str] | None,
                   tables: Mapping[str, Sequence[str]] = CONFIG_KEYS) -> tuple[Setting, ...]:
    """Every `--set` read and its key checked against `tables`; a key set twice takes the last
    value, as a repeated flag does."""
    texts = list(texts or ())
    if len(texts) > MAX_SETTINGS:
        raise ConfigError(f"--set: given {len(texts):,} times, more than {MAX_SETTINGS}")
    models = [Setting(path=("model",), value=str(text), text=f"--model {text}")
              for text in texts if isinstance(text, ModelFlag)]
    return (*models[-1:], *(parse_setting(text, tables) for text in texts
                            if not isinstance(text, ModelFlag)))


def parse_setting(text: str, tables: Mapping[str, Sequence[str]] = CONFIG_KEYS) -> Setting:
    """One `--set SECTION.KEY=VALUE`, its key checked and its value read (module docstring)."""
    name, equals, raw = text.partition("=")
    flag = f"--set {show(text)}:"
    if not equals:
        raise ConfigError(f"{flag} must be SECTION.KEY=VALUE (write e.g. parallel.tp=4)")
    path = tuple(name.strip().split("."))
    if len(path) < 2 or len(path) > MAX_DEPTH or not all(path):
        raise ConfigError(f"{flag} {show(name)} must be SECTION.KEY, up to {MAX_DEPTH} names "
                          "joined by dots (write e.g. parallel.tp=4)")
    if path[0] not in tables:
        raise ConfigError(f"{flag} [{show(path[0])[1:-1]}] is not a table of the config "
                          f"(known: {', '.join(tables)})")
    if path[1] not in tables[path[0]]:
        raise ConfigError(f"{flag} {show(path[1])} is not a key of [{path[0]}] "
                          f"(known: {', '.join(tables[path[0]])})")
    return Setting(path=path, value=read_value(raw, flag), text=text)


def read_value(raw: str, flag: str) -> Any:
    """A TOML value, or a bare word as the string it spells; an empty or broken value is
    refused (a quoted string or a list that does not parse is a typo, not a word)."""
    raw = raw.strip()
    if not raw:
        raise ConfigError(f"{flag} no value after '=' (write e.g. parallel.tp=4 or "
                          "model.dtype=fp8)")
    if len(raw) > MAX_VALUE_CHARS:
        raise ConfigError(f"{flag} a value of {len(raw):,} characters, more than "
                          f"{MAX_VALUE_CHARS:,}")
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except RecursionError:
        raise ConfigError(f"{flag} not a TOML value: nested too deeply") from None
    except ValueError as err:  # TOMLDecodeError; a word is a string, a broken literal is not
        if raw[0] in "\"'[{" or "\n" in raw:
            raise ConfigError(f"{flag} not a TOML value: {err}") from None
        return raw


def apply_settings(data: Mapping[str, Any], settings: Sequence[Setting]) -> dict[str, Any]:
    """A copy of the parsed config with each setting in place (tables on the way made where
    missing); `data` itself is left as it was."""
    out = _copy(data)
    for setting in settings:
        if setting.path == ("model",):  # --model: the whole table (`model_source.flag_table`)
            out["model"] = flag_table(out.get("model"), setting.value)
            continue
        table = out
        for depth, name in enumerate(setting.path[:-1]):
            inner = table.get(name, {})
            if not isinstance(inner, dict):
                where = ".".join(setting.path[:depth + 1])
                raise ConfigError(f"--set {show(setting.text)}: {where} is {show(inner)} in "
                                  "the config, not a table")
            table[name] = inner
            table = inner
        table[setting.path[-1]] = setting.value
    return out


def _copy(value: Any) -> Any:
    """Tables copied all the way down (values are never changed in place, only tables)."""
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, Mapping) else value


@contextmanager
def named_as_flags(settings: Sequence[Setting]) -> Iterator[None]:
    """A ConfigError about a key that `--set` gave is named as the flag: "--set
    parallel.tp=0: 0 must be ..." rather than "parallel.tp: ...", so the user sees which of
    their words was refused."""
    try:
        yield
    except ConfigError as err:
        message = str(err)
        for setting in reversed(settings):  # the last setting of a key is the one in force
            prefix = f"{setting.key}: "
            if message.startswith(prefix):
                raise ConfigError(f"--set {_flag_text(setting)}: "
                                  f"{message[len(prefix):]}") from None
        raise


def _flag_text(setting: Setting) -> str:
    """The flag as the user gave it, quoted: the key whole (a known key, so short: the error
    names it) and the value shortened (it may be anything)."""
    _, _, value = setting.text.partition("=")
    return f"'{setting.key}={show(value)[1:-1]}'"


def load_config(path: str | Path, settings: Sequence[Setting]) -> dict[str, Any]:
    """The TOML file at `path`, parsed, with the settings in place."""
    return apply_settings(load_toml(path), settings)


def load_set_experiment(path: str | Path, settings: Sequence[Setting],
                        overrides: Mapping[str, Any] | None = None) -> Experiment:
    """`sim.config.load_experiment` with the settings in place (flags like --profile in
    `overrides` still win over [sim])."""
    path = Path(path)
    data = load_config(path, settings)
    with named_as_flags(settings):
        return experiment_from_dict(data, name=path.stem, base=path.parent,
                                    overrides=overrides)


def config_sha256(path: str | Path, settings: Sequence[Setting]) -> str:
    """The provenance digest of a config and its settings: the file's sha256 alone when there
    are none (so outputs without `--set` are as they were), else the sha256 of the file's
    digest and the settings written canonically (JSON, in the order given)."""
    digest = file_sha256(path)
    sources = model_sources(path, settings)
    if not settings and not sources:
        return digest
    text = json.dumps({"config_sha256": digest,
                       "set": [[s.key, s.value] for s in settings],
                       **({"model_sources": sources} if sources else {})},
                      sort_keys=True, separators=(",", ":"), allow_nan=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def model_sources(path: str | Path, settings: Sequence[Setting]) -> list[str]:
    """The sha256 of each config.json the [model] reads (`[model] from`, `--model`,
    `--set model.from`), so that a digest changes when the file does; [] without one."""
    found = []
    model = load_toml(path).get("model")
    if isinstance(model, dict) and isinstance(model.get(FROM), str):
        found.append(source_path(model[FROM], "model.from", Path(path).parent))
    for s in settings:
        if s.path == ("model",):
            found.append(source_path(s.value, "--model", Path.cwd()))
        elif s.path == ("model", FROM):
            found.append(source_path(s.value, "model.from", Path(path).parent))
    return [file_sha256(p) for p in found]


def search_tables() -> dict[str, Sequence[str]]:
    """The tables a search config may set: the experiment's and [search]."""
    from sim.search.space import SEARCH_KEYS

    return {**CONFIG_KEYS, "search": SEARCH_KEYS}


def load_search_config(path: str | Path, settings: Sequence[Setting]) -> dict[str, Any]:
    """A search config with the settings in place; `--set parallel.K=V` fixes K, so it is
    no longer searched (a key is either fixed or searched: `sim.search.space`)."""
    data = load_config(path, settings)
    search = data.get("search")
    if isinstance(search, dict):
        for setting in settings:
            if setting.path[0] == "parallel" and len(setting.path) == 2:
                search.pop(setting.path[1], None)
    return data
