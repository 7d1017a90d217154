"""PyTorch profiler import: torch.profiler's Chrome-trace JSON (kineto) as a parasim `Trace`.

    from traces.kineto import load_kineto
    trace = load_kineto("rank0.json.gz")      # one rank's file (.json or .json.gz)
    trace = load_kineto("profiles/")          # a folder of per-rank files

Collectives and sends/receives are found once however many events record them, compute ops are
the kernels (GPU) or the outermost CPU ops (gloo), dependencies are inferred
(`traces.kineto.deps`), and everything left out is counted in meta "skipped". Every problem with
a file is one `ConfigError` line naming it (`traces.kineto.files`).

The method in full: docs/kineto-import.md (what each field holds).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traces.errors import ConfigError
from traces.header import TraceMeta
from traces.kineto import files
from traces.kineto.deps import dependencies, in_order
from traces.kineto.events import Events, parse
from traces.kineto.files import MAX_BYTES
from traces.kineto.rank import RankContext, RankOps, RawOp, rank_ops
from traces.nogc import paused_gc
from traces.ops import Op, OpKind, Trace

__all__ = ["MAX_BYTES", "dropped", "load_kineto"]

STATES_NOTHING = frozenset({"wait for a collective", "communication record naming no collective"})
"""Reasons in meta "skipped" that lose nothing: the event is no op of its own."""


def dropped(skipped: Mapping[str, int] | None) -> dict[str, int]:
    """Of a trace's meta "skipped", the events left out that did state work parasim cannot
    use (an unknown category or phase, a collective it does not model, a kernel without its
    call): what a warning must count."""
    return {why: n for why, n in (skipped or {}).items() if why not in STATES_NOTHING}


@dataclass(frozen=True, slots=True)
class _RankFile:
    path: Path
    rank: int
    world_size: int | None
    backend: str | None
    groups: list[dict[str, Any]]
    events: Events
    origin_ns: int
    """The earliest event, in nanoseconds of the shared clock (base + timestamp)."""


def load_kineto(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> Trace:
    """The timed trace of a profiler file or a folder of per-rank files (see module doc)."""
    with paused_gc():
        rank_files = [_read_rank(p, max_bytes) for p in files.trace_files(Path(path))]
        world_size = _world_size(rank_files)
        zero_ns = min(f.origin_ns for f in rank_files)
        found = {f.rank: _rank_ops(f, world_size) for f in rank_files}
        ops = {f.rank: _timed_ops(*found[f.rank][1:], origin_us=f.events.origin_us,
                                  offset_s=(f.origin_ns - zero_ns) * 1e-9)
               for f in rank_files}
    skipped: Counter[str] = Counter()
    for result, _, _ in found.values():
        skipped.update(result.skipped)
    backends = {f.backend for f in rank_files}
    meta = TraceMeta(
        source="kineto",
        world_size=world_size,
        ranks=tuple(sorted(ops)),
        backend=backends.pop() if len(backends) == 1 else None,
        process_groups={f.rank: f.groups for f in rank_files},
        files={f.rank: f.path.name for f in rank_files},
        compute_from="gpu" if all(f.events.device for f in rank_files) else "cpu",
        num_group_assumed=sum(r.num_group_assumed for r, _, _ in found.values()),
        num_size_unknown=sum(r.num_size_unknown for r, _, _ in found.values()),
        skipped=dict(sorted(skipped.items())),
    )
    return Trace(ops=ops, meta=meta)


def _read_rank(path: Path, max_bytes: int) -> _RankFile:
    document = files.read_document(path, max_bytes)
    rank = files.rank_of(document, path)
    world_size = files.world_size_of(document, path)
    if world_size is not None and rank >= world_size:
        raise ConfigError(f"{path}: rank {rank} is outside its world of {world_size} ranks")
    events = parse(document["traceEvents"], str(path))
    return _RankFile(path=path, rank=rank, world_size=world_size,
                     backend=files.backend_of(document),
                     groups=files.process_groups(document, path),
                     events=events, origin_ns=files.base_time_ns(document)
                     + round(events.origin_us * 1000))


def _rank_ops(rank_file: _RankFile, world_size: int,
              ) -> tuple[RankOps, list[RawOp], list[tuple[int, ...]]]:
    """The rank's findings, its ops in list order, and their dependencies."""
    files.check_groups(rank_file.groups, world_size, rank_file.path)
    context = RankContext(rank=rank_file.rank, world_size=world_size,
                          groups={g["name"]: tuple(g["ranks"]) for g in rank_file.groups},
                          source=str(rank_file.path))
    events = rank_file.events
    found = rank_ops(events, context)
    if not found.ops:
        raise ConfigError(f"{rank_file.path}: nothing parasim can use: no compute op and no "
                          f"collective{_left_out(found.skipped)}")
    ops = in_order(found.ops)
    return found, ops, dependencies(ops, events.waits, bool(events.device))


def _left_out(skipped: Counter[str]) -> str:
    if not skipped:
        return ""
    return " (left out: " + ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())) + ")"


def _world_size(rank_files: list[_RankFile]) -> int:
    seen: dict[int, Path] = {}
    for f in rank_files:
        if f.rank in seen:
            raise ConfigError(f"{f.path}: rank {f.rank} again (also in {seen[f.rank].name}); "
                              "a folder holds one file per rank")
        seen[f.rank] = f.path
    sizes = {f.world_size for f in rank_files if f.world_size is not None}
    if len(sizes) > 1:
        raise ConfigError(f"{rank_files[0].path.parent}: files of different jobs: world sizes "
                          f"{sorted(sizes)}")
    world_size = sizes.pop() if sizes else max(seen) + 1
    if max(seen) >= world_size:
        raise ConfigError(f"{seen[max(seen)]}: rank {max(seen)} is outside the world of "
                          f"{world_size} ranks")
    return world_size


def _timed_ops(ops: list[RawOp], deps: list[tuple[int, ...]], *, origin_us: float,
               offset_s: float) -> tuple[Op, ...]:
    """The ops in seconds: from the file's earliest event, plus the file's offset."""
    return tuple(_op(raw, dep, offset_s + (raw.start - origin_us) * 1e-6,
                     offset_s + (raw.end - origin_us) * 1e-6) for raw, dep in zip(ops, deps))


def _op(raw: RawOp, deps: tuple[int, ...], start: float, end: float) -> Op:
    if raw.kind == OpKind.COMPUTE:
        return Op(kind=raw.kind, stream=raw.stream, name=raw.name, deps=deps, start=start,
                  end=end)
    return Op(kind=raw.kind, stream=raw.stream, name=raw.name, deps=deps, group=raw.group,
              size_bytes=raw.size_bytes, dtype=raw.dtype or "unknown", peer=raw.peer,
              start=start, end=end)
