"""Chrome trace-event export of a timed trace, for Perfetto (ui.perfetto.dev) and chrome://tracing.

One complete event ("ph": "X") per op: pid = rank, tid = the op's stream on that rank (numbered
0, 1, ... in order of first appearance), ts and dur in microseconds, the op's non-default fields
in args. Metadata events ("ph": "M") name each process "rank N" and each thread after its stream.
View one: `parasim simulate CONFIG.toml --trace step.json`, then open step.json in ui.perfetto.dev.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from traces.errors import ConfigError
from traces.files import PathLike, write_text_atomic
from traces.ops import Op, OpKind, Trace

# The op fields shown in a slice's details panel when they differ from their defaults.
_ARG_FIELDS = ("layer", "microbatch", "phase", "flops", "mem_bytes", "group", "size_bytes",
               "dtype", "peer", "tag")
_DEFAULTS = {f.name: f.default for f in fields(Op)}


def to_chrome(trace: Trace) -> dict[str, Any]:
    """The trace as a Chrome trace-event JSON object; raises ConfigError for a plan."""
    _check_timed(trace)
    events: list[dict[str, Any]] = []
    for rank in sorted(trace.ops):
        ops = trace.ops[rank]
        tids: dict[str, int] = {}
        for op in ops:
            tids.setdefault(op.stream, len(tids))
        events += _rank_metadata(rank, tids)
        events += (_complete_event(op, rank, tids[op.stream]) for op in ops)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": dict(trace.meta)}


def dumps_chrome(trace: Trace) -> str:
    """The file text of `to_chrome(trace)`: compact JSON, one line."""
    document = to_chrome(trace)
    try:
        return json.dumps(document, separators=(",", ":"), allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"trace cannot be written as JSON: {exc}") from exc


def save_chrome(trace: Trace, path: PathLike) -> None:
    """Write `to_chrome(trace)` to `path` atomically."""
    try:
        text = dumps_chrome(trace)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    write_text_atomic(path, text)


def _check_timed(trace: Trace) -> None:
    for rank in sorted(trace.ops):
        for index, op in enumerate(trace.ops[rank]):
            if op.start is None or op.end is None:
                raise ConfigError(f"trace is not timed: rank {rank} op {index} has no start/end "
                                  "(export a simulated or measured trace, not a plan)")


def _rank_metadata(rank: int, tids: dict[str, int]) -> list[dict[str, Any]]:
    events = [_metadata("process_name", rank, 0, name=f"rank {rank}"),
              _metadata("process_sort_index", rank, 0, sort_index=rank)]
    for stream, tid in tids.items():
        events.append(_metadata("thread_name", rank, tid, name=stream))
        events.append(_metadata("thread_sort_index", rank, tid, sort_index=tid))
    return events


def _metadata(event: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": event, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _complete_event(op: Op, rank: int, tid: int) -> dict[str, Any]:
    assert op.start is not None and op.end is not None, "checked by _check_timed"
    # Whole nanoseconds first, so an op that ends exactly where the next one starts still does
    # after Perfetto rounds ts*1000 and dur*1000 back to integer nanoseconds.
    start_ns, end_ns = round(op.start * 1e9), round(op.end * 1e9)
    return {"name": event_name(op), "cat": str(op.kind), "ph": "X",
            "ts": start_ns / 1000, "dur": (end_ns - start_ns) / 1000,
            "pid": rank, "tid": tid, "args": _args(op)}


def event_name(op: Op) -> str:
    """'attn fwd L3 mb5', 'all_reduce 12.0MiB', 'send->5', 'recv<-4'."""
    peer = "?" if op.peer is None else op.peer
    if op.kind == OpKind.SEND:
        return f"send->{peer}"
    if op.kind == OpKind.RECV:
        return f"recv<-{peer}"
    if op.kind.is_collective:
        return f"{op.kind} {_binary_size(op.size_bytes)}"
    parts = [op.name or str(op.kind)]
    if op.phase is not None:
        parts.append(str(op.phase))
    if op.layer is not None:
        parts.append(f"L{op.layer}")
    if op.microbatch is not None:
        parts.append(f"mb{op.microbatch}")
    return " ".join(parts)


def _args(op: Op) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for name in _ARG_FIELDS:
        value = getattr(op, name)
        if value != _DEFAULTS[name]:
            args[name] = list(value) if isinstance(value, tuple) else value
    if "phase" in args:
        args["phase"] = str(args["phase"])
    return args


def _binary_size(size_bytes: float) -> str:
    """12582912 -> '12.0MiB' (powers of 1024, as nccl-tests counts buffer sizes)."""
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if size_bytes >= 1024**power:
            return f"{size_bytes / 1024**power:.1f}{unit}"
    return f"{size_bytes:.0f}B"
