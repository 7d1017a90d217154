"""The rules on one trace op's values that `traces.io` checks on load, and the bound on a
trace's op count: sizes, FLOPs, bytes and times within physical maxima (`traces.units`), so a
replay never divides by a subnormal size nor answers 1e288 s, and no trace builds more ops
than `traces.plan.MAX_PLAN_OPS`, the bound `simulate` keeps too.

`Bad` is a rule broken inside one op; `traces.io` adds the file, rank and op to its line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from traces.errors import ConfigError, show
from traces.parse_memory import check_parse_memory
from traces.plan import MAX_PLAN_OPS
from traces.units import MAX_OP_BYTES, MAX_OP_FLOPS, MAX_SIZE_BYTES, MAX_STEP_SECONDS

MAX_TRACE_OPS = MAX_PLAN_OPS
"""10 M ops: a loaded trace holds at most as many ops as `simulate` builds. A load peaks at
~1.2 kB an op (text, parsed JSON and `Op`s together: 1.0 GB for the 850 k ops of
gpt3-175b-1024-a100's trace), so the bound keeps a load under ~13 GB; a 30 M-op file, refused
now in a second, ran out of memory at 11.7 GB after 102 s."""

# The key every op has, as the compact writer and any plain JSON writer spell it. A JSON string
# cannot hold an unescaped quote, so each occurrence is a key: the count never exceeds the ops
# (an escaped spelling such as "\u0073tream" is missed here and caught after parsing).
_STREAM_KEY = b'"stream":'


class Bad(Exception):
    """A rule broken inside one op; the caller adds the location."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(rule)
        self.field = field
        self.rule = rule


def show_json(value: object) -> str:
    """A value for an error line, with its JSON type: 'string "1e12"', 'list [2.0]', 'null'."""
    if value is None:
        return "null"
    scalar = isinstance(value, str | int | float) and _is_plain(value)
    text = json.dumps(value) if scalar else show(value)  # containers: bounded, any depth
    kind = {dict: "object", list: "list", str: "string", bool: "boolean"}
    name = kind.get(type(value), type(value).__name__)
    return f"{name} {text[:40] + '...' if len(text) > 40 else text}"


def _is_plain(value: object) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def number(value: object) -> float:
    """A finite, non-negative JSON number as a float, or `Bad`."""
    if type(value) is not float and type(value) is not int:
        raise Bad("", f"must be a number, got {show_json(value)}")
    try:
        result = float(value)
    except OverflowError:  # an integer beyond float range
        result = math.inf
    if not math.isfinite(result):
        raise Bad("", f"must be a finite number, got {show_json(value)}")
    if result < 0:
        raise Bad("", f"must not be negative, got {show_json(value)}")
    return result


def _bounded(limit: float, what: str) -> Callable[[object], float]:
    def decode(value: object) -> float:
        result = number(value)
        if result > limit:
            raise Bad("", f"must be at most {limit:,.6g} {what}, got {show_json(value)}")
        return result
    return decode


def _optional(decode: Callable[[object], float]) -> Callable[[object], float | None]:
    return lambda value: None if value is None else decode(value)


def size(value: object) -> float:
    """A message size: 0 (unstated) or 1 byte to `MAX_SIZE_BYTES`."""
    result = number(value)
    if 0 < result < 1 or result > MAX_SIZE_BYTES:
        raise Bad("", f"must be 0 (unstated) or 1 to {MAX_SIZE_BYTES:,} bytes (1 TiB), "
                      f"got {show_json(value)}")
    return result


flops = _bounded(MAX_OP_FLOPS, "(a day at 1e17 FLOP/s)")
mem_bytes = _bounded(MAX_OP_BYTES, "bytes (a day at 1e14 B/s)")
draws = _bounded(MAX_OP_BYTES, "random draws (a day at 1e14 a second)")
time = _optional(_bounded(MAX_STEP_SECONDS, "s (a day; a trace's times count from its start)"))

# Upper bounds the loader's fast path applies to plain floats (in range: no decoder call).
LIMITS = {"flops": MAX_OP_FLOPS, "mem_bytes": MAX_OP_BYTES, "draws": MAX_OP_BYTES,
          "start": MAX_STEP_SECONDS, "end": MAX_STEP_SECONDS}


def check_times(start: float | None, end: float | None) -> None:
    if (start is None) != (end is None):
        raise Bad("start" if end is None else "end", "start and end must be given together")
    if start is not None and end is not None and end < start:
        raise Bad("end", f"end {end!r} is before start {start!r}")


def check_text_op_count(raw: bytes, source: str) -> None:
    """Refuse a trace file with more than MAX_TRACE_OPS ops before its JSON is parsed (parsing
    30 M ops alone takes ~12 GB)."""
    count = raw.count(_STREAM_KEY)
    _refuse_past_bound(count, source, "at least ")
    check_parse_memory(len(raw), count, source)


def check_op_count(ranks: dict[str, object], source: str) -> None:
    """Refuse parsed ranks holding more than MAX_TRACE_OPS ops before any `Op` is built."""
    _refuse_past_bound(sum(len(ops) for ops in ranks.values() if isinstance(ops, list)),
                       source, "")


def _refuse_past_bound(count: int, source: str, qualifier: str) -> None:
    if count > MAX_TRACE_OPS:
        raise ConfigError(f"{source}: the trace holds {qualifier}{count:,} ops, more than the "
                          f"{MAX_TRACE_OPS:,} parasim loads (replay a shorter step, or fewer "
                          f"ranks)")
