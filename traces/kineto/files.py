"""Reading torch.profiler files: bounded decompression, the format check, and whose rank it is.

Every problem is a `ConfigError` with one line naming the file: not gzip though named .gz, a
corrupt or truncated gzip, more than `MAX_BYTES` of JSON (a gzip bomb stops there), invalid or
truncated JSON, a JSON document that is not a profiler trace, an unknown `schemaVersion`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from traces.errors import ConfigError, show
from traces.gzipped import GZIP_MAGIC, gunzip
from traces.parse_memory import check_parse_memory

MAX_BYTES = 2 * 1024**3
"""2 GiB of JSON, after decompression: far beyond any profile one would replay (the real
8-GPU trace in tests/data/kineto holds 35 MB), and a bound a gzip bomb cannot pass."""

SCHEMA_VERSIONS = (1,)
_MAX_RANKS = 1 << 20
"""More ranks than any job has run (the simulator's own bound is 65,536 accelerators)."""
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
# Event categories torch.profiler writes; a file without schemaVersion must hold one of them.
_KINETO_CATEGORIES = frozenset({"cpu_op", "user_annotation", "kernel", "cuda_runtime",
                                "gpu_memcpy", "gpu_memset", "python_function"})
_SUFFIXES = (".json", ".json.gz")


def trace_files(path: Path) -> list[Path]:
    """`path` itself, or the .json / .json.gz files of a folder (not its subfolders), sorted."""
    if not path.exists():
        raise ConfigError(f"{path}: no such file or folder")
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_SUFFIXES))
    if not files:
        raise ConfigError(f"{path}: no profiler traces in the folder (expected *.json or "
                          "*.json.gz files, one per rank)")
    return files


def read_document(path: Path, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """The file's JSON object, checked to be a torch.profiler (kineto) trace."""
    raw = _read_bytes(path, max_bytes)
    check_parse_memory(len(raw), raw.count(b'"ph"'), str(path), "events")
    try:
        document = json.loads(raw)
    except RecursionError as exc:
        raise ConfigError(f"{path}: not a profiler trace: JSON nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ConfigError(f"{path}: not valid JSON (truncated or corrupt?): {exc}") from exc
    check_format(document, str(path))
    return document


def _read_bytes(path: Path, max_bytes: int) -> bytes:
    """The file's JSON bytes, decompressed when gzip (`traces.gzipped`), at most `max_bytes`."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if not data.startswith(GZIP_MAGIC) and len(data) > max_bytes:
        raise ConfigError(f"{path}: holds more than {max_bytes} bytes of JSON; stopped reading "
                          "there (the bound on a profiler trace)")
    return gunzip(data, str(path), max_bytes, "the bound on a profiler trace")


def check_format(document: object, source: str) -> None:
    if isinstance(document, dict) and document.get("schema") == "parasim.trace":
        raise ConfigError(f"{source}: a parasim trace, not a profiler trace: read it with "
                          "traces.io.load")
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        raise ConfigError(f"{source}: not a PyTorch profiler trace: expected a JSON object with "
                          "a 'traceEvents' list")
    supported = ", ".join(map(str, SCHEMA_VERSIONS))
    if "schemaVersion" in document:
        version = document["schemaVersion"]
        if type(version) is not int or version not in SCHEMA_VERSIONS:
            raise ConfigError(f"{source}: unsupported kineto schemaVersion {show(version)} "
                              f"(supported: {supported})")
    elif not any(isinstance(e, dict) and e.get("cat") in _KINETO_CATEGORIES
                 for e in document["traceEvents"]):
        raise ConfigError(f"{source}: not a PyTorch profiler trace: no 'schemaVersion' and no "
                          "events of the kinds torch.profiler writes")


def distributed_info(document: dict[str, Any]) -> dict[str, Any]:
    info = document.get("distributedInfo")
    return info if isinstance(info, dict) else {}


def rank_of(document: dict[str, Any], path: Path) -> int:
    """distributedInfo.rank, else the N of 'rankN' / 'rank_N' / 'rank-N' in the file name."""
    rank = distributed_info(document).get("rank")
    if rank is not None:
        if type(rank) is not int or not 0 <= rank < _MAX_RANKS:
            raise ConfigError(f"{path}: distributedInfo.rank {show(rank)} is not a rank (an "
                              f"integer from 0 to {_MAX_RANKS - 1:,})")
        return rank
    found = _RANK_IN_NAME.findall(path.name)
    if found:
        return int(found[-1])
    raise ConfigError(f"{path}: cannot tell whose rank this is: no distributedInfo.rank in the "
                      "trace and no 'rankN' in the file name (rename it, e.g. rank0.json)")


def world_size_of(document: dict[str, Any], path: Path) -> int | None:
    size = distributed_info(document).get("world_size")
    if size is not None and (type(size) is not int or not 1 <= size <= _MAX_RANKS):
        raise ConfigError(f"{path}: distributedInfo.world_size {show(size)} is not a world size "
                          f"(an integer from 1 to {_MAX_RANKS:,})")
    return size


def backend_of(document: dict[str, Any]) -> str | None:
    backend = distributed_info(document).get("backend")
    return backend if isinstance(backend, str) and backend else None


def process_groups(document: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """distributedInfo.pg_config as [{"name", "desc", "ranks"}]; a malformed entry (no name,
    ranks that are not distinct ranks) is a `ConfigError` naming it."""
    groups = []
    config = distributed_info(document).get("pg_config")
    if config is not None and not isinstance(config, list):
        raise ConfigError(f"{path}: distributedInfo.pg_config {show(config)} is not a list")
    for index, entry in enumerate(config or ()):
        where = f"{path}: distributedInfo.pg_config[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("pg_name"), str):
            raise ConfigError(f"{where}: {show(entry)} is not a group (an object with a string "
                              "pg_name and its ranks)")
        ranks = entry.get("ranks")
        if (not isinstance(ranks, list) or not ranks or len(set(map(repr, ranks))) != len(ranks)
                or not all(type(r) is int and 0 <= r < _MAX_RANKS for r in ranks)):
            raise ConfigError(f"{where} ({show(entry['pg_name'])}): ranks {show(ranks)} are not "
                              "distinct ranks")
        desc = entry.get("pg_desc")
        groups.append({"name": entry["pg_name"], "desc": desc if isinstance(desc, str) else "",
                       "ranks": list(ranks)})
    return groups


def check_groups(groups: list[dict[str, Any]], world_size: int, path: Path) -> None:
    """Every group's ranks lie in the world of `world_size` ranks."""
    for group in groups:
        if max(group["ranks"]) >= world_size:
            raise ConfigError(f"{path}: distributedInfo.pg_config group {show(group['name'])} "
                              f"names rank {max(group['ranks'])}, outside the world of "
                              f"{world_size} ranks")


def base_time_ns(document: dict[str, Any]) -> int:
    """What event timestamps count from: baseTimeNanoseconds (newer traces), else the epoch."""
    base = document.get("baseTimeNanoseconds")
    return base if type(base) is int and base >= 0 else 0
