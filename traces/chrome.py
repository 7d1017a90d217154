"""Chrome trace-event export of a timed trace, for Perfetto (ui.perfetto.dev) and chrome://tracing.

    parasim simulate CONFIG.toml --chrome step.json.gz     # then open it in ui.perfetto.dev

What the file holds:

- one complete event ("ph": "X") per op: pid = rank, tid = the op's stream, ts and dur in
  microseconds (from whole nanoseconds, so ops that touch still touch), the op's non-default
  fields in args;
- threads in a stable order: the plan's streams as `traces.ops.Stream` lists them (compute
  first), then any other stream by name; each named after its stream;
- processes named after the rank and, when the trace says so, its pipeline rank and how many
  devices it stands for: "pp 1 · rank 64 (stands for 64 GPUs: tp 8 × dp 8)" for a folded plan
  (meta `fold`; the device word is meta `devices`, default "devices"; `traces.header`);
- a flow arrow from each send to the receive it matches (the k-th send from a to b with a tag
  meets the k-th receive on b from a with that tag), both ends present;
- a counter track per rank, "memory GiB", where the trace carries meta `memory`:
  {"<rank>": [[time_s, bytes], ...]}, a step curve (`sim.report.timeline.annotate` writes it from
  the
  memory model for a simulated step).

`save_chrome` gzips the JSON (`traces.gzipped`) when the path ends in ".gz" (mtime 0, so the
same trace gives the same bytes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from traces.errors import ConfigError
from traces.files import PathLike, write_text_atomic
from traces.gzipped import text_or_gzip
from traces.header_json import meta_to_json
from traces.json_chunks import Counted, dumps_counted
from traces.ops import Op, OpKind, Stream, Trace

# The op fields shown in a slice's details panel when they differ from their defaults.
_ARG_FIELDS = ("layer", "microbatch", "phase", "flops", "mem_bytes", "group", "size_bytes",
               "dtype", "peer", "tag")
_DEFAULTS = {f.name: f.default for f in fields(Op)}
STREAM_ORDER = tuple(str(s) for s in Stream)
GiB = 2**30


def to_chrome(trace: Trace, progress: Counted | None = None) -> dict[str, Any]:
    """The trace as a Chrome trace-event JSON object; raises ConfigError for a plan.
    `progress('rank', done, total)` after each rank's events."""
    _check_timed(trace)
    names = process_names(trace)
    memory = trace.meta.memory or {}
    events: list[dict[str, Any]] = []
    tids: dict[int, dict[str, int]] = {}
    for rank in sorted(trace.ops):
        ops = trace.ops[rank]
        tids[rank] = stream_ids(op.stream for op in ops)
        events += _rank_metadata(rank, names[rank], tids[rank])
        events += (_complete_event(op, rank, tids[rank][op.stream]) for op in ops)
        events += _counter(rank, memory.get(rank, ()))
        if progress is not None:
            progress("rank", len(tids), len(trace.ops))
    events += _flows(trace, tids)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta_to_json(trace.meta)}


def dumps_chrome(trace: Trace, progress: Counted | None = None) -> str:
    """The file text of `to_chrome(trace)`: compact JSON, one line (`progress` counts the
    ranks built, then the events written)."""
    document = to_chrome(trace, progress)
    try:
        return dumps_counted(document, "traceEvents", progress)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"trace cannot be written as JSON: {exc}") from exc


def save_chrome(trace: Trace, path: PathLike) -> None:
    """Write `to_chrome(trace)` to `path` atomically (gzipped for a ".gz" path)."""
    try:
        text = dumps_chrome(trace)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    write_text_atomic(path, text_or_gzip(text, path))


def stream_ids(streams: Any) -> dict[str, int]:
    """Thread ids for the streams present: the plan's in `Stream` order, then others by
    name, so the same streams get the same ids whatever order their ops come in."""
    present = set(streams)
    known = [s for s in STREAM_ORDER if s in present]
    return {s: i for i, s in enumerate(known + sorted(present - set(known)))}


def process_names(trace: Trace) -> dict[int, str]:
    """'pp 1 · rank 64 (stands for 64 GPUs: tp 8 × dp 8)' for a folded plan's rank, 'rank 5
    (pp 1, tp 1, dp 0)' where the layout is known, else 'rank 5'."""
    fold = trace.meta.fold
    layout = fold or trace.meta.layout
    devices = trace.meta.devices or "devices"
    names = {}
    for rank in trace.ops:
        if layout is None or not 0 <= rank < layout.world:
            names[rank] = f"rank {rank}"
            continue
        c = layout.coords(rank)
        if fold is not None:
            names[rank] = (f"pp {c.pp} · rank {rank} (stands for {fold.tp * fold.dp} "
                           f"{devices}: tp {fold.tp} × dp {fold.dp})")
        else:
            names[rank] = f"rank {rank} (pp {c.pp}, tp {c.tp}, dp {c.dp})"
    return names


def _check_timed(trace: Trace) -> None:
    for rank in sorted(trace.ops):
        for index, op in enumerate(trace.ops[rank]):
            if op.start is None or op.end is None:
                raise ConfigError(f"trace is not timed: rank {rank} op {index} has no start/end "
                                  "(export a simulated or measured trace, not a plan)")


def _rank_metadata(rank: int, name: str, tids: dict[str, int]) -> list[dict[str, Any]]:
    events = [_metadata("process_name", rank, 0, name=name),
              _metadata("process_sort_index", rank, 0, sort_index=rank)]
    for stream, tid in tids.items():
        events.append(_metadata("thread_name", rank, tid, name=stream))
        events.append(_metadata("thread_sort_index", rank, tid, sort_index=tid))
    return events


def _metadata(event: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": event, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _us(seconds: float) -> float:
    # Whole nanoseconds first, so an op that ends exactly where the next one starts still does
    # after Perfetto rounds ts*1000 and dur*1000 back to integer nanoseconds.
    return round(seconds * 1e9) / 1000


def _complete_event(op: Op, rank: int, tid: int) -> dict[str, Any]:
    assert op.start is not None and op.end is not None, "checked by _check_timed"
    start_ns, end_ns = round(op.start * 1e9), round(op.end * 1e9)
    return {"name": event_name(op), "cat": str(op.kind), "ph": "X",
            "ts": start_ns / 1000, "dur": (end_ns - start_ns) / 1000,
            "pid": rank, "tid": tid, "args": _args(op)}


def _flows(trace: Trace, tids: dict[int, dict[str, int]]) -> list[dict[str, Any]]:
    """A flow from each send to its receive: "s" inside the send's slice, "f" (binding to
    the enclosing slice, "bp": "e") inside the receive's, both at the slice's middle so they
    bind to it and not to a neighbour that touches it."""
    sends: dict[tuple[int, int, str], list[tuple[int, Op]]] = {}
    recvs: dict[tuple[int, int, str], list[tuple[int, Op]]] = {}
    for rank in sorted(trace.ops):
        for op in trace.ops[rank]:
            if op.kind is OpKind.SEND and op.peer is not None:
                sends.setdefault((rank, op.peer, op.tag), []).append((rank, op))
            elif op.kind is OpKind.RECV and op.peer is not None:
                recvs.setdefault((op.peer, rank, op.tag), []).append((rank, op))
    events: list[dict[str, Any]] = []
    for key in sorted(sends):
        for (src, send), (dst, recv) in zip(sends[key], recvs.get(key, []), strict=False):
            flow = {"name": send.tag or "p2p", "cat": "p2p", "id": len(events) // 2}
            events.append({**flow, "ph": "s", "pid": src, "tid": tids[src][send.stream],
                           "ts": _middle(send)})
            events.append({**flow, "ph": "f", "bp": "e", "pid": dst,
                           "tid": tids[dst][recv.stream], "ts": _middle(recv)})
    return events


def _middle(op: Op) -> float:
    assert op.start is not None and op.end is not None, "checked by _check_timed"
    start_ns, end_ns = round(op.start * 1e9), round(op.end * 1e9)
    return (start_ns + (end_ns - start_ns) // 2) / 1000


def _counter(rank: int, points: Iterable[tuple[float, float]]) -> list[dict[str, Any]]:
    return [{"name": "memory", "ph": "C", "pid": rank, "ts": _us(t),
             "args": {"GiB": round(b / GiB, 6)}} for t, b in points]


def event_name(op: Op) -> str:
    """'attn fwd L3 mb5', 'all_reduce 12.0MiB', 'send->5', 'recv<-4'."""
    peer = "?" if op.peer is None else op.peer
    if op.kind == OpKind.SEND:
        return f"send->{peer}"
    if op.kind == OpKind.RECV:
        return f"recv<-{peer}"
    if op.kind.is_collective:
        return f"{op.kind} {binary_size(op.size_bytes)}"
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
    if op.name and op.kind is not OpKind.COMPUTE:
        args["carries"] = op.name
    return args


def binary_size(size_bytes: float) -> str:
    """12582912 -> '12.0MiB' (powers of 1024, as nccl-tests counts buffer sizes)."""
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if size_bytes >= 1024**power:
            return f"{size_bytes / 1024**power:.1f}{unit}"
    return f"{size_bytes:.0f}B"
