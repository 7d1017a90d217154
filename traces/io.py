"""Trace files: JSON with a schema name and version, lossless both ways, checked on load.

Layout (one line, compact separators; ranks sorted, op fields in dataclass order):

    {"schema": "parasim.trace", "version": 3, "meta": {...},
     "ranks": {"0": [{"kind": "compute", "stream": "compute", "name": "qkv",
                      "purpose": {"type": "kernel", "kernel": "qkv"}, "flops": 1e12, ...}, ...]}}

Each op always carries "kind" and "stream" and otherwise only the fields that differ from the
`Op` defaults, so a 200k-op plan stays small. Enums are written as their values, tuples as lists,
a purpose as its object (`traces.purpose_io`). Version 3 added `purpose`: the ops of a version-1
or -2 file get theirs from their names, in `traces.legacy`, the one place that reads names.
`load` reads a regular file of at most 2 GiB (`traces.files`) and checks every rule a reader
relies on: types, enum values, numbers finite and not negative (FLOPs, bytes, sizes, layers,
times) and within physical bounds, sizes 0 or at least a byte, at most `MAX_TRACE_OPS` ops
(`traces.op_rules`), deps pointing backwards, start/end together, a send/recv's peer another
rank, a collective's group non-empty with distinct ranks and holding the op's own rank, a send
and the receive it meets (k-th to k-th per source, destination and tag, where the trace holds
both) of one size, an all-to-all's `split` (`traces.alltoallv`, written only when uneven) one
size per member adding up to its size_bytes, rank keys canonical decimals of at most 9 digits.
(Whether a peer or group member exists is for the replay, which knows the world.) The "meta"
object is the typed header `traces.header.TraceMeta`, converted by `traces.header_json` (which
reads older spellings). Any problem is a `ConfigError` with one line naming the file, rank, op
and field. `save` writes atomically. Check a file: `python -c "import traces.io as t;
t.load('step.json')"`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, fields, replace
from enum import StrEnum
from itertools import compress
from operator import attrgetter, ne
from typing import Any

from traces import alltoallv, op_rules, purpose_io
from traces.errors import ConfigError, show
from traces.files import MAX_TRACE_BYTES, PathLike, parse_json, read_bytes, write_text_atomic
from traces.gzipped import gunzip
from traces.header_json import meta_from_json, meta_to_json
from traces.json_chunks import Counted, dumps_counted
from traces.legacy import legacy_purposes
from traces.nogc import paused_gc
from traces.op_rules import Bad as _Bad
from traces.op_rules import check_op_count, check_text_op_count, check_times
from traces.op_rules import show_json as _show
from traces.ops import COLLECTIVES, Op, OpKind, Phase, Trace
from traces.transfers import check_transfer_sizes

SCHEMA = "parasim.trace"
VERSION = 3
# version 2 added `gemm` and `span` (a version-1 file has neither); version 3 the ops' `purpose`
# and the meta's `cluster_spec` (older files name their cluster only by its display name)
SUPPORTED_VERSIONS = (1, 2, 3)

__all__ = ["PathLike", "SCHEMA", "VERSION", "check_transfer_sizes", "dumps", "from_json", "load",
           "save", "to_json", "write_text_atomic"]

_REQUIRED = ("kind", "stream")
# Optional fields and their defaults, computed once: the per-op loops only compare and copy.
_OPTIONAL = tuple((f.name, f.default) for f in fields(Op) if f.name not in _REQUIRED)
assert all(default is not MISSING for _, default in _OPTIONAL), "optional Op fields have defaults"
_NAMES = tuple(name for name, _ in _OPTIONAL)
_DEFAULTS = tuple(default for _, default in _OPTIONAL)
_GET_OPTIONAL = attrgetter(*_NAMES)
_TUPLE_FIELDS = tuple(name for name, default in _OPTIONAL if isinstance(default, tuple))
_ENUM_FIELDS = ("phase",)


# --- writing ---------------------------------------------------------------------------------

def to_json(trace: Trace, progress: Counted | None = None) -> dict[str, Any]:
    """The trace as a JSON-able dict (ranks in ascending order, defaults omitted);
    `progress('rank', done, total)` after each rank."""
    ranks: dict[str, list[dict[str, Any]]] = {}
    with paused_gc():
        for rank in sorted(trace.ops):
            ranks[str(rank)] = [_encode_op(op) for op in trace.ops[rank]]
            if progress is not None:
                progress("rank", len(ranks), len(trace.ops))
    return {"schema": SCHEMA, "version": VERSION, "meta": meta_to_json(trace.meta),
            "ranks": ranks}


def _encode_op(op: Op) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": str(op.kind), "stream": op.stream}
    values = _GET_OPTIONAL(op)
    # The non-default fields, picked in C (map/compress) rather than a Python loop per field.
    out.update(compress(zip(_NAMES, values), map(ne, values, _DEFAULTS)))
    for name in _TUPLE_FIELDS:
        if name in out:
            out[name] = list(out[name])
    for name in _ENUM_FIELDS:
        if name in out:
            out[name] = str(out[name])
    if "purpose" in out:
        out["purpose"] = purpose_io.encode(out["purpose"])
    if "split" in out:
        out["split"] = alltoallv.to_json(out["split"])
    return out


def dumps(trace: Trace, progress: Counted | None = None) -> str:
    """The file text: deterministic, so the same trace always gives the same bytes
    (`progress` counts the ranks encoded, then the ops written)."""
    try:
        # allow_nan=False: NaN/Infinity are not JSON, and load would reject them anyway.
        return dumps_counted(to_json(trace, progress), "ranks", progress)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"trace cannot be written as JSON: {exc}") from exc


def save(trace: Trace, path: PathLike) -> None:
    """Write `trace` to `path` atomically (a failed write leaves any old file untouched)."""
    write_text_atomic(path, dumps(trace))


# --- reading ---------------------------------------------------------------------------------

def load(path: PathLike) -> Trace:
    """Read and check a trace file; any problem is a `ConfigError` naming the file."""
    source = str(path)
    raw = gunzip(read_bytes(path, limit=MAX_TRACE_BYTES), source, MAX_TRACE_BYTES)
    check_text_op_count(raw, source)  # before parsing: the parsed ops alone outgrow the text
    with paused_gc():
        data = parse_json(raw, source)
    del raw
    return from_json(data, source)


def from_json(data: object, source: str = "trace") -> Trace:
    """The inverse of `to_json`, checking every rule; `source` names the input in errors."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object at the top, got {_show(data)}")
    version = _check_header(data, source)
    raw_meta = data.get("meta", {})
    if not isinstance(raw_meta, dict):
        raise ConfigError(f"{source}: 'meta' must be an object, got {_show(raw_meta)}")
    ranks = data.get("ranks")
    if not isinstance(ranks, dict):
        raise ConfigError(f"{source}: 'ranks' must be an object of rank -> op list, "
                          f"got {_show(ranks)}")
    unknown = sorted(set(data) - {"schema", "version", "meta", "ranks"})
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key {unknown[0]!r}")
    meta = meta_from_json(raw_meta, version)  # errors name "trace: meta.<key>"
    check_op_count(ranks, source)
    ops = {}
    with paused_gc():
        for key, raw_ops in ranks.items():
            rank = _rank_key(key, source)
            ops[rank] = _decode_rank(rank, raw_ops, source)
            if data["version"] < 3:
                ops[rank] = _with_legacy_purposes(ops[rank], rank, source)
        check_transfer_sizes(((rank, i, op) for rank, rank_ops in ops.items()
                              for i, op in enumerate(rank_ops) if op.kind in _P2P), source)
    return Trace(ops=ops, meta=meta)


def _with_legacy_purposes(ops: tuple[Op, ...], rank: int, source: str) -> tuple[Op, ...]:
    """A version-1/2 rank's ops with the purposes their names meant (`traces.legacy`)."""
    if any(op.purpose is not None for op in ops):
        raise ConfigError(f"{source}: rank {rank}: 'purpose' is a field of trace version 3")
    return tuple(replace(op, purpose=p) if p is not None else op
                 for op, p in zip(ops, legacy_purposes(ops)))


def _check_header(data: dict[str, Any], source: str) -> int:
    """The file's schema version, once the schema and version are checked."""
    schema = data.get("schema")
    if schema != SCHEMA:
        found = "no 'schema'" if "schema" not in data else f"schema {_show(schema)}"
        raise ConfigError(f"{source}: not a parasim trace: expected schema {SCHEMA!r}, "
                          f"found {found}")
    supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
    if "version" not in data:
        raise ConfigError(f"{source}: no trace 'version' (supported: {supported})")
    version = data["version"]
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise ConfigError(f"{source}: unsupported trace version {_show(version)} "
                          f"(supported: {supported})")
    return version


MAX_RANK_DIGITS = 9  # a billion ranks; int() of 5,000 digits would raise a bare ValueError


def _rank_key(key: str, source: str) -> int:
    # Canonical decimal only: '01' and '1' would otherwise both name rank 1 and one would be lost.
    if not (key.isascii() and key.isdigit() and len(key) <= MAX_RANK_DIGITS) or \
            str(int(key)) != key:
        raise ConfigError(f"{source}: rank key {show(key)} is not a non-negative decimal "
                          f"integer of at most {MAX_RANK_DIGITS} digits")
    return int(key)


def _decode_rank(rank: int, raw_ops: object, source: str) -> tuple[Op, ...]:
    if not isinstance(raw_ops, list):
        raise ConfigError(f"{source}: rank {rank}: ops must be a list, got {_show(raw_ops)}")
    decoded = []
    for index, raw in enumerate(raw_ops):
        try:
            decoded.append(_decode_op(raw, index, rank))
        except _Bad as bad:
            where = f"rank {rank}, op {index}" + (f", field {bad.field!r}" if bad.field else "")
            raise ConfigError(f"{source}: {where}: {bad.rule}") from None
    return tuple(decoded)


def _decode_op(raw: object, index: int, rank: int) -> Op:
    """Check every rule for one op, raising `_Bad` with the rule; build the op."""
    if not isinstance(raw, dict):
        raise _Bad("", f"an op must be an object, got {_show(raw)}")
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        # Most fields are a plain string, integer or finite float: accept those inline, without
        # a decoder call per field (this loop runs millions of times for a large trace).
        plain = _PLAIN.get(name)
        # NaN fails the comparison too; the bounds are `traces.op_rules.LIMITS`
        if type(value) is plain and (plain is str or 0 <= value <= _LIMITS.get(name, _INF)):
            kwargs[name] = value
            continue
        decode = _DECODERS.get(name)
        if decode is None:
            raise _Bad(name, "unknown op field")
        try:
            kwargs[name] = decode(value)
        except _Bad as failure:
            failure.field = name
            raise
    for name in _REQUIRED:
        if name not in kwargs:
            raise _Bad(name, "missing (every op needs 'kind' and 'stream')")
    deps = kwargs.get("deps")
    if deps and (min(deps) < 0 or max(deps) >= index):
        bad = next(dep for dep in deps if not 0 <= dep < index)
        raise _Bad("deps", f"dep {bad} is not an earlier op of this rank "
                           f"(deps point backwards: 0 <= dep < {index})")
    if kwargs["kind"] is not _COMPUTE or "peer" in kwargs or "group" in kwargs:
        _check_peers(kwargs, rank)
    start, end = kwargs.get("start"), kwargs.get("end")
    if start is not None or end is not None:
        check_times(start, end)
    split = kwargs.get("split")
    if split is not None:
        try:
            alltoallv.check_split(split, str(kwargs["kind"]), kwargs.get("group", ()),
                                  kwargs.get("size_bytes", 0.0))
        except ValueError as err:
            raise _Bad("split", str(err)) from None
    return Op(**kwargs)


def _check_peers(kwargs: dict[str, Any], rank: int) -> None:
    """A send/recv names a peer other than its own rank; a collective a group of distinct
    ranks. (Negative numbers are refused field by field.)"""
    kind, peer, group = kwargs["kind"], kwargs.get("peer"), kwargs.get("group")
    if peer is None:
        if kind in _P2P:
            raise _Bad("peer", f"a {kind} needs a peer rank")
    elif peer == rank:
        raise _Bad("peer", f"{peer} is this op's own rank (a peer is another rank)")
    if group:
        if min(group) < 0 or len(set(group)) != len(group):
            raise _Bad("group", f"{_show(list(group))} must list distinct ranks >= 0")
        if kind in _COLLECTIVE_KINDS and rank not in group:
            raise _Bad("group", f"{_show(list(group))} does not hold this op's rank {rank} (a "
                                f"rank issues a collective only on a group it is in)")
    elif kind in _COLLECTIVE_KINDS:
        raise _Bad("group", f"a {kind} needs a non-empty group of ranks")


# --- field decoders: each returns the Op value or raises _Bad with the rule ---------------------

def _string(value: object) -> str:
    if type(value) is not str:
        raise _Bad("", f"must be a string, got {_show(value)}")
    return value


def _integer(value: object) -> int:
    if type(value) is not int:  # bool is an int subclass; 'type is' rejects it
        raise _Bad("", f"must be an integer, got {_show(value)}")
    if value < 0:
        raise _Bad("", f"must not be negative, got {_show(value)}")
    return value


def _optional_integer(value: object) -> int | None:
    return None if value is None else _integer(value)


def _integers(value: object) -> tuple[int, ...]:
    if type(value) is not list or not set(map(type, value)) <= _INT_ONLY:
        raise _Bad("", f"must be a list of integers, got {_show(value)}")
    return tuple(value)


def _gemm(value: object) -> tuple[int, ...]:
    shape = _integers(value)
    if len(shape) != 4 or min(shape) < 1:
        raise _Bad("", f"must be [batch, M, N, K], four positive integers, got {_show(value)}")
    return shape


def _purpose(value: object) -> Any:
    try:
        return purpose_io.decode(value)
    except ValueError as err:
        raise _Bad("", str(err)) from None


def _split(value: object) -> Any:
    try:
        return alltoallv.from_json(value)
    except ValueError as err:
        raise _Bad("", str(err)) from None


def _enum_decoder(enum: type[StrEnum], optional: bool) -> Callable[[object], Any]:
    members = {str(member): member for member in enum}
    expected = ", ".join(members)

    def decode(value: object) -> Any:
        if value is None and optional:
            return None
        member = members.get(value) if type(value) is str else None
        if member is None:
            raise _Bad("", f"unknown {enum.__name__} value {_show(value)} "
                           f"(expected one of: {expected})")
        return member

    return decode


_DECODERS: dict[str, Callable[[object], Any]] = {
    "kind": _enum_decoder(OpKind, optional=False),
    "stream": _string,
    "name": _string,
    "purpose": _purpose,
    "deps": _integers,
    "layer": _optional_integer,
    "microbatch": _optional_integer,
    "phase": _enum_decoder(Phase, optional=True),
    "flops": op_rules.flops,
    "mem_bytes": op_rules.mem_bytes,
    "draws": op_rules.draws,
    "group": _integers,
    "size_bytes": op_rules.size,
    "split": _split,
    "dtype": _string,
    "peer": _optional_integer,
    "tag": _string,
    "gemm": _gemm,
    "span": _optional_integer,
    "start": op_rules.time,
    "end": op_rules.time,
}
_INF = math.inf
_COMPUTE = OpKind.COMPUTE
_SEND, _RECV = OpKind.SEND, OpKind.RECV
_P2P = frozenset({_SEND, _RECV})
_COLLECTIVE_KINDS = frozenset(COLLECTIVES)
_INT_ONLY = frozenset({int})  # the element types deps and group may have (bool is not int)
# Fields whose JSON value already is the Op value when it has this exact type (bool is not int)
# and, for numbers, is finite, not negative (every count, index and time is >= 0) and in bound.
_PLAIN: dict[str, Any] = {
    "stream": str, "name": str, "dtype": str, "tag": str, "layer": int, "microbatch": int,
    "peer": int, "span": int, "flops": float, "mem_bytes": float, "draws": float,
    "start": float, "end": float,
}  # not size_bytes: its rule (0, or 1 byte to 1 TiB) is more than a bound
_LIMITS = op_rules.LIMITS
assert set(_DECODERS) == {f.name for f in fields(Op)} >= set(_PLAIN), "every Op field"
