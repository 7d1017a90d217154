"""`TraceMeta` to and from the "meta" object of a trace file: the one place that knows its keys.

    {"model": {...ModelSpec's fields...}, "layout": {...Layout's...}, "world": 16,
     "fold": {"axes": ["tp", "dp"], "layout": {...}},          # a folded plan only
     "fold_classes": {"rep_of": [0, 0, 2, 2, ...], "cp_step": 0},  # folded by identity only
     "experiment": "gpt3", "cluster": "dgx-a100 x2 rail",       # the display name, a label
     "cluster_spec": {"preset": "dgx-a100", "nodes": 2, "fabric": "rail",
                      "nic_bandwidth": "400Gb/s"},             # version 3: rebuilds it
     "network": "flow", "timed": true, "memory": {"0": [[0.0, 1.5e9], ...]}, ...}

A field the trace does not state is absent (None in `TraceMeta`); per-rank tables are keyed by
the rank's decimal string. Keys parasim does not know are kept in `TraceMeta.extras` and
written back after the known ones. Reading checks every known entry and raises `ConfigError`
with one line naming it (`trace: meta.fold.layout.tp: ...`); the fold's world must be the
meta's `world`; `fold_classes` must name a representative for every rank of the meta's
`layout`, each its own. Older spellings still read: version 1's `"folded": true` (the plan
folded with its own `layout`), and, for files before version 3, the cluster's display name
as the only statement of its cluster (`_legacy_cluster`, the one reader of that name).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from traces.errors import ConfigError, check_keys, show
from traces.header import FOLD_AXES, ClusterTable, FoldClasses, TableValue, TraceMeta
from traces.layout import Layout
from traces.mla import MLA_KEYS
from traces.model import ModelSpec
from traces.moe_spec import MOE_KEYS

__all__ = ["meta_from_json", "meta_to_json"]

_LAYOUT_KEYS = tuple(f.name for f in fields(Layout))
_MODEL_KEYS = tuple(f.name for f in fields(ModelSpec))
_OPTIONAL_MODEL_KEYS = {f.name: f.default for f in fields(ModelSpec)
                        if f.name in ("kv_heads", "ffn", "norm", "position", "bias", "fp8_recipe",
                                      "fp8_non_tn", "fp4_recipe", "head_dim", "qk_norm",
                                      "dropout", "kernels",
                                      *MLA_KEYS, *MOE_KEYS, "mtp_layers")}
"""The Llama-style, FP8, dropout, latent-attention and MoE keys (issues 18-20): written only
where they differ from GPT's defaults (kv_heads = heads, head_dim = hidden / heads, dropout
0.1, no experts, no qk_norm; head_dim only where h/a is whole), so a GPT
plan's header is what it was and older readers still read it; a header without them (any
older trace) reads as the defaults."""


def _model_json(m: ModelSpec) -> dict[str, Any]:
    out = {}
    for key in _MODEL_KEYS:
        value = getattr(m, key)
        default = m.heads if key == "kv_heads" else _default_head_dim(m) if key == "head_dim" \
            else _OPTIONAL_MODEL_KEYS.get(key, _NO_DEFAULT)
        if value != default or key not in _OPTIONAL_MODEL_KEYS:
            out[key] = value
    return out


def _default_head_dim(m: ModelSpec) -> object:
    """h/a, what a header without head_dim reads as; none when a does not divide h (such a
    model states its head_dim, `traces.heads`)."""
    return _NO_DEFAULT if m.hidden % m.heads else m.hidden // m.heads


_NO_DEFAULT = object()
_CLUSTER_KEYS = ("preset", "nodes", "fabric")
_MAX_RANK_DIGITS = 9


# --- writing ---------------------------------------------------------------------------------

def meta_to_json(meta: TraceMeta) -> dict[str, Any]:
    """The "meta" object: the stated fields in `TraceMeta`'s order, then the extras."""
    out: dict[str, Any] = {}
    for name, key, _, write in _FIELDS:
        value = getattr(meta, name)
        if value is not None:
            out[key] = write(value)
    assert not set(meta.extras) & set(out), "extras never shadow a field"
    out.update(meta.extras)
    return out


def _ranked(write: Callable[[Any], Any]) -> Callable[[Mapping[int, Any]], dict[str, Any]]:
    return lambda table: {str(rank): write(value) for rank, value in table.items()}


def _same(value: Any) -> Any:
    return value


def _listed(value: tuple[Any, ...]) -> list[Any]:
    return list(value)


# --- reading ---------------------------------------------------------------------------------

def meta_from_json(raw: Mapping[str, Any], version: int, source: str = "trace") -> TraceMeta:
    """The header a file's "meta" object states (`version`: the file's schema version)."""
    values: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for key, value in raw.items():
        entry = _BY_KEY.get(key)
        if entry is None:
            if key != "folded":
                extras[key] = value
            continue
        name, read = entry
        if value is not None:
            values[name] = read(value, f"{source}: meta.{key}")
    if "fold" not in raw and raw.get("folded") is True:  # version 1's spelling
        values["fold"] = _layout(raw.get("layout"), f"{source}: meta.layout")
    fold, world = values.get("fold"), values.get("world")
    if fold is not None and world is not None and world != fold.world:
        where = f"{source}: meta.fold.layout" if "fold" in raw else f"{source}: meta.layout"
        raise ConfigError(f"{where}: tp {fold.tp} x cp {fold.cp} x pp {fold.pp} x "
                          f"dp {fold.dp} = {fold.world:,} ranks, but meta.world is {world}")
    if "fold_classes" in values:
        _check_classes(values["fold_classes"], values.get("layout"), f"{source}: meta.fold_classes")
    if version < 3 and "cluster_spec" not in values and "cluster_name" in values:
        values["cluster_spec"] = _legacy_cluster(values["cluster_name"])
    return TraceMeta(**values, extras=extras)


def _legacy_cluster(name: str) -> ClusterTable | None:
    """LEGACY (trace versions 1 and 2), the one reader of a cluster's display name: those files
    state their cluster only as `Cluster.name`, "PRESET xNODES FABRIC". Whether the preset and
    fabric exist is for `topology` to say when the table is rebuilt."""
    words = name.split(" ")
    if len(words) != 3 or not words[1].startswith("x") or not words[1][1:].isdecimal():
        return None
    preset, count, fabric = words
    return ClusterTable(preset=preset, nodes=int(count[1:]), fabric=fabric)


def _fail(where: str, value: object, rule: str) -> ConfigError:
    return ConfigError(f"{where}: {show(value)} {rule}")


def _string(value: object, where: str) -> str:
    if type(value) is not str:
        raise _fail(where, value, "must be a string")
    return value


def _boolean(value: object, where: str) -> bool:
    if type(value) is not bool:
        raise _fail(where, value, "must be true or false")
    return value


def _count(value: object, where: str) -> int:
    if type(value) is not int or value < 0:
        raise _fail(where, value, "must be a non-negative integer")
    return value


def _integer(value: object, where: str) -> int:
    if type(value) is not int:
        raise _fail(where, value, "must be an integer")
    return value


def _as_read(value: object, where: str) -> object:
    """JSON kept as it is (a profiler's own description of its process groups)."""
    return value


def _positive(value: object, where: str) -> int:
    if type(value) is not int or value < 1:
        raise _fail(where, value, "must be a positive integer")
    return value


def _number(value: object, where: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or \
            not 0 <= value < float("inf"):  # NaN fails too
        raise _fail(where, value, "must be a finite number >= 0")
    return float(value)


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, value, "must be an object")
    return value


def _list(read: Callable[[object, str], Any]) -> Callable[[object, str], tuple[Any, ...]]:
    def decode(value: object, where: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise _fail(where, value, "must be a list")
        return tuple(read(item, where) for item in value)
    return decode


def _by_rank(read: Callable[[object, str], Any]) -> Callable[[object, str], dict[int, Any]]:
    """An object keyed by ranks' canonical decimals ("0", "12"), each value read by `read`."""
    def decode(value: object, where: str) -> dict[int, Any]:
        table = _object(value, where)
        out = {}
        for key, item in table.items():
            if not (key.isascii() and key.isdigit() and len(key) <= _MAX_RANK_DIGITS) or \
                    str(int(key)) != key:
                raise ConfigError(f"{where}: key {show(key)} is not a rank (a decimal integer)")
            out[int(key)] = read(item, f"{where}.{key}")
        return out
    return decode


def _by_name(read: Callable[[object, str], Any]) -> Callable[[object, str], dict[str, Any]]:
    def decode(value: object, where: str) -> dict[str, Any]:
        return {key: read(item, f"{where}.{key}") for key, item in _object(value, where).items()}
    return decode


def _memory(value: object, where: str) -> dict[int, tuple[tuple[float, float], ...]]:
    def points(item: object, _: str) -> tuple[tuple[float, float], ...]:
        if not isinstance(item, list) or not all(isinstance(p, list) and len(p) == 2
                                                 for p in item):
            raise ValueError
        return tuple((_number(t, where), _number(b, where)) for t, b in item)
    try:
        return _by_rank(points)(value, where)
    except (ConfigError, ValueError):
        raise ConfigError(f"{where} must map ranks to [[time_s, bytes], ...]") from None


def _model(value: object, where: str) -> ModelSpec:
    table = _object(value, where)
    check_keys(table, _MODEL_KEYS, where)
    with _renamed("model", where):
        return ModelSpec(**table)


def _layout(value: object, where: str) -> Layout:
    """`Layout(**table)`, its errors (named `parallel.<field>`) renamed to `where.<field>`."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be an object of the [parallel] keys")
    check_keys(value, _LAYOUT_KEYS, where)
    with _renamed("parallel", where):
        return Layout(**value)


def _fold(value: object, where: str) -> Layout:
    if not isinstance(value, dict) or value.get("axes") != list(FOLD_AXES):
        raise ConfigError(f"{where} must be an object with \"axes\": {list(FOLD_AXES)} and a "
                          f"\"layout\"; got {show(value)}")
    return _layout(value.get("layout"), f"{where}.layout")


def _fold_classes(value: object, where: str) -> FoldClasses:
    table = _object(value, where)
    check_keys(table, ("rep_of", "cp_step"), where)
    if "rep_of" not in table:
        raise ConfigError(f"{where}: no 'rep_of' (each rank's representative)")
    return FoldClasses(_list(_count)(table["rep_of"], f"{where}.rep_of"),
                       _count(table.get("cp_step", 0), f"{where}.cp_step"))


def _fold_classes_json(classes: FoldClasses) -> dict[str, Any]:
    return {"rep_of": list(classes.rep_of), "cp_step": classes.cp_step}


def _check_classes(classes: FoldClasses, layout: Layout | None, where: str) -> None:
    """Classes of the meta's layout: a representative for each of its ranks, no later than
    the rank, standing for itself; a cp step that divides CP."""
    if layout is None:
        raise ConfigError(f"{where}: classes of ranks need the meta's 'layout'")
    rep_of = classes.rep_of
    if len(rep_of) != layout.world:
        raise ConfigError(f"{where}.rep_of: {len(rep_of):,} ranks, but meta.layout has "
                          f"{layout.world:,}")
    bad = next((r for r, rep in enumerate(rep_of) if rep > r or rep_of[rep] != rep), None)
    if bad is not None:
        raise ConfigError(f"{where}.rep_of: rank {bad}'s representative {rep_of[bad]} is not "
                          "a rank at or before it that stands for itself")
    step = classes.cp_step
    if step and (step >= layout.cp or layout.cp % step):
        raise ConfigError(f"{where}.cp_step: {step} does not divide cp {layout.cp} (0: no "
                          "fold over CP)")


class _renamed:
    """Re-raise a value's own ConfigError ("model.heads: ...") under `where` instead."""

    def __init__(self, table: str, where: str) -> None:
        self.table, self.where = table, where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, err: BaseException | None, tb: object) -> None:
        if isinstance(err, ConfigError):
            message = str(err)
            for prefix in (f"{self.table}.", f"{self.table}:"):
                if message.startswith(prefix):
                    message = self.where + message[len(self.table):]
                    break
            raise ConfigError(message) from None


def _table_value(value: object, where: str) -> TableValue:
    if type(value) in (str, int, float, bool):
        return value  # type: ignore[return-value]
    if isinstance(value, list) and all(type(v) in (int, float) for v in value):
        return tuple(value)
    raise _fail(where, value, "must be a string, number, boolean or list of numbers")


def _cluster_table(value: object, where: str) -> ClusterTable:
    table = _object(value, where)
    for key in _CLUSTER_KEYS:
        if key not in table:
            raise ConfigError(f"{where}: no {key!r} (a cluster table states its preset, nodes "
                              "and fabric)")
    overrides = tuple(sorted((key, _table_value(item, f"{where}.{key}"))
                             for key, item in table.items() if key not in _CLUSTER_KEYS))
    return ClusterTable(preset=_string(table["preset"], f"{where}.preset"),
                        nodes=_positive(table["nodes"], f"{where}.nodes"),
                        fabric=_string(table["fabric"], f"{where}.fabric"), overrides=overrides)


# (TraceMeta field, JSON key, reader, writer), in the order the keys are written.
_FIELDS: tuple[tuple[str, str, Callable[[object, str], Any], Callable[[Any], Any]], ...] = (
    ("model", "model", _model, _model_json),
    ("layout", "layout", _layout, lambda layout: layout.to_dict()),
    ("world", "world", _positive, _same),
    ("fold", "fold", _fold, lambda f: {"axes": list(FOLD_AXES), "layout": f.to_dict()}),
    ("fold_classes", "fold_classes", _fold_classes, _fold_classes_json),
    ("experiment", "experiment", _string, _same),
    ("cluster_name", "cluster", _string, _same),
    ("cluster_spec", "cluster_spec", _cluster_table, lambda c: c.table()),
    ("network", "network", _string, _same),
    ("timed", "timed", _boolean, _same),
    ("memory", "memory", _memory, _ranked(lambda points: [[t, b] for t, b in points])),
    ("devices", "devices", _string, _same),
    ("source", "source", _string, _same),
    ("world_size", "world_size", _positive, _same),
    ("ranks", "ranks", _list(_count), _listed),
    ("measured", "measured", _boolean, _same),
    ("host", "host", _string, _same),
    ("platform", "platform", _string, _same),
    ("torch", "torch", _string, _same),
    ("backend", "backend", _string, _same),
    ("config", "config", _object, dict),
    ("complete", "complete", _boolean, _same),
    ("error", "error", _string, _same),
    ("clock", "clock", _string, _same),
    ("step_seconds", "step_seconds", _list(_number), _listed),
    ("peak_memory_bytes", "peak_memory_bytes", _by_rank(_count), _ranked(_same)),
    ("clock_offsets_ns", "clock_offsets_ns", _by_rank(_integer), _ranked(_same)),
    ("clock_error_ns", "clock_error_ns", _by_rank(_count), _ranked(_same)),
    ("host_probe", "host_probe", _object, dict),
    ("process_groups", "process_groups", _by_rank(_as_read), _ranked(_same)),
    ("files", "files", _by_rank(_string), _ranked(_same)),
    ("compute_from", "compute_from", _string, _same),
    ("num_group_assumed", "num_group_assumed", _count, _same),
    ("num_size_unknown", "num_size_unknown", _count, _same),
    ("skipped", "skipped", _by_name(_count), dict),
    ("bench", "bench", _object, dict),
)
_BY_KEY = {key: (name, read) for name, key, read, _ in _FIELDS}
assert {name for name, *_ in _FIELDS} == {f.name for f in fields(TraceMeta)} - {"extras"}, \
    "every TraceMeta field has one JSON key"
