"""Reading Chakra execution traces (a folder of `<name>.<rank>.et`, or one such file) as a
parasim `Trace`.

A folder parasim exported (`traces.chakra_write`: its `GlobalMetadata` carries `parasim.meta`)
reads back exactly: each node's `parasim.op` is the op, checked by `traces.io` as a trace file
is, and its `data_deps` must agree with it. Any other Chakra trace (ASTRA-sim's, Chakra's
converters') is read from Chakra's own fields:

* `COMP_NODE` -> a compute op on stream "compute", timed by `duration_micros` (from
  `start_time_micros`) where that is above 0, with `num_ops` as FLOPs and `tensor_size` as bytes;
  a `METADATA_NODE` -> an empty compute op (it keeps the dependencies through it);
* `COMM_COLL_NODE` -> the collective of its `comm_type` (REDUCE_SCATTER_BLOCK as reduce_scatter,
  BARRIER as an all-reduce of its size), of `comm_size` bytes, over the ranks `comm_group.json`
  lists for its `pg_name`, else over every rank of the folder;
* `COMM_SEND_NODE` / `COMM_RECV_NODE` -> a send to `comm_dst` / a receive from `comm_src`,
  tagged by `comm_tag`;
* `data_deps` -> the op's deps; the op's stream is its string attribute `stream` (parasim's
  export states it), else "compute" for compute, else that of the last op of a stream it has a
  `ctrl_deps` on (how parasim exports stream order), else a stream of its own; a ctrl_dep that
  is not the op before on its stream is a dep too. Deps must name earlier nodes of the file.

Bounds before anything is built: the folder's files at most `MAX_TRACE_BYTES` together, at most
`MAX_TRACE_OPS` nodes in all; ranks 0 to N-1 each once (parasim's export: the ranks it
states it wrote, `parasim.ranks`, a folded plan's fewer).
Every problem is one `ConfigError` line naming the file and the node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from traces.chakra_schema import INTEGER_VALUES, CommType, Messages, NodeType, frames, messages
from traces.chakra_write import GROUPS_FILE, META_ATTR, OP_ATTR, RANK_ATTR, RANKS_ATTR
from traces.errors import ConfigError, show
from traces.files import MAX_TRACE_BYTES, read_bytes
from traces.gzipped import gunzip
from traces.io import SCHEMA, VERSION, from_json
from traces.op_rules import MAX_TRACE_OPS
from traces.ops import Trace

ET_FILE = re.compile(r"^(?P<name>.+)\.(?P<rank>0|[1-9][0-9]{0,8})\.et(?:\.gz)?$")
"""Chakra's per-rank file name (gzipped too, as Chakra's reader accepts)."""

_KINDS = {CommType.ALL_REDUCE: "all_reduce", CommType.ALL_GATHER: "all_gather",
          CommType.REDUCE_SCATTER: "reduce_scatter", CommType.REDUCE_SCATTER_BLOCK:
          "reduce_scatter", CommType.BROADCAST: "broadcast", CommType.ALL_TO_ALL: "all_to_all",
          CommType.BARRIER: "all_reduce"}
_MICROS = 1e6

Nodes = list[Any]


def et_files(folder: Path) -> dict[int, Path]:
    """The folder's Chakra files by rank (none: an empty dict); two files of one rank (two
    traces in one folder) is one line."""
    found: dict[int, Path] = {}
    for path in sorted(folder.iterdir()):
        match = ET_FILE.match(path.name)
        if match is None or not path.is_file():
            continue
        rank = int(match["rank"])
        if rank in found:
            raise ConfigError(f"{path}: rank {rank} again (also {found[rank].name}); a folder "
                              "holds one Chakra trace, each rank once")
        found[rank] = path
    return found


def load_chakra(path: Path) -> tuple[Trace, tuple[Path, ...]]:
    """The trace of a Chakra folder (or one `.et` file), and the files read."""
    if path.is_dir():
        files = et_files(path)
        if not files:
            raise ConfigError(f"{path}: holds no Chakra trace files (<name>.<rank>.et)")
    else:
        match = ET_FILE.match(path.name)
        if match is None:
            raise ConfigError(f"{path}: not a Chakra trace name (<name>.<rank>.et)")
        files = {int(match["rank"]): path}
    _check_total_size(files)
    m = messages()
    read: dict[int, tuple[Any, Nodes]] = {}
    count = 0
    for rank, file in files.items():
        header, nodes = _read_file(file, m)
        count += len(nodes)
        if count > MAX_TRACE_OPS:
            raise ConfigError(f"{path}: more than {MAX_TRACE_OPS:,} nodes, the most parasim "
                              "loads (export a shorter step, or fewer ranks)")
        read[rank] = (header, nodes)
    ours = {rank: _attr(header, META_ATTR) is not None for rank, (header, _) in read.items()}
    if len(set(ours.values())) > 1:
        odd = next(r for r, mine in ours.items() if mine != ours[min(ours)])
        raise ConfigError(f"{files[odd]}: exported by parasim and {files[min(ours)].name} not "
                          "(or the other way round); a folder holds one trace")
    label = str(path)
    if ours[min(ours)]:
        exported = _exported(read, files)
        trace = _ours(read, files, label)
    else:
        exported = list(range(max(files) + 1))
        groups = _groups(path / GROUPS_FILE if path.is_dir() else path.parent / GROUPS_FILE)
        trace = _theirs(read, files, groups, label)
    if path.is_dir():
        missing = sorted(set(exported) - set(files))
        if missing:
            raise ConfigError(f"{label}: no file for rank {missing[0]} ({len(missing)} of "
                              f"{len(exported)} ranks missing); a Chakra trace has one file per "
                              "rank")
    return trace, tuple(files.values())


def _exported(read: Mapping[int, tuple[Any, Nodes]], files: Mapping[int, Path]) -> list[int]:
    """The ranks a parasim export wrote (`parasim.ranks`, the same in every file)."""
    first = min(read)
    ranks = _attr(read[first][0], RANKS_ATTR)
    for rank, (header, _) in read.items():
        own = _attr(header, RANKS_ATTR)
        if own is None or own != ranks:
            raise ConfigError(f"{files[rank]}: {RANKS_ATTR} differs from "
                              f"{files[first].name}'s; a folder holds the files of one export")
    return list(ranks.values)


def _check_total_size(files: Mapping[int, Path]) -> None:
    total = 0
    for file in files.values():
        try:
            total += file.stat().st_size
        except OSError as err:
            raise ConfigError(f"{file}: cannot read: {err.strerror or err}") from None
        if total > MAX_TRACE_BYTES:
            raise ConfigError(f"{file.parent}: its Chakra files hold more than "
                              f"{MAX_TRACE_BYTES:,} bytes, the most parasim reads")


def _read_file(file: Path, m: Messages) -> tuple[Any, Nodes]:
    label = str(file)
    data = gunzip(read_bytes(file, limit=MAX_TRACE_BYTES), label, MAX_TRACE_BYTES)
    raw = frames(data, label)
    if not raw:
        raise ConfigError(f"{label}: empty: a Chakra ET file starts with its GlobalMetadata")
    if len(raw) - 1 > MAX_TRACE_OPS:
        raise ConfigError(f"{label}: {len(raw) - 1:,} nodes, more than {MAX_TRACE_OPS:,}, the "
                          "most parasim loads")
    header = _parse(m.GlobalMetadata, raw[0], m, f"{label}: not a Chakra ET file: its first "
                    "message is not a GlobalMetadata")
    if not header.version:
        raise ConfigError(f"{label}: not a Chakra ET file: its GlobalMetadata states no "
                          "version")
    nodes = [_parse(m.Node, body, m, f"{label}: not a Chakra ET file: message {i + 1} is "
                    "not a Node") for i, body in enumerate(raw[1:])]
    return header, nodes


def _parse(kind: Any, body: bytes, m: Messages, failure: str) -> Any:
    message = kind()
    try:
        message.ParseFromString(body)
    except m.decode_error:
        raise ConfigError(failure) from None
    return message


def _attr(message: Any, name: str) -> Any:
    """The value of the message's attribute `name` (any of the oneof's types), or None."""
    for attr in message.attr:
        if attr.name == name:
            which = attr.WhichOneof("value")
            return None if which is None else getattr(attr, which)
    return None


def _integer(node: Any, name: str, label: str, default: int | None = None) -> int:
    for attr in node.attr:
        if attr.name == name:
            which = attr.WhichOneof("value")
            if which not in INTEGER_VALUES:
                break
            return int(getattr(attr, which))
    if default is not None:
        return default
    raise ConfigError(f"{label}: node {node.id} ({show(node.name)}): no integer attribute "
                      f"{name!r}")


# --- parasim's own export --------------------------------------------------------------------

def _ours(read: Mapping[int, tuple[Any, Nodes]], files: Mapping[int, Path], label: str) -> Trace:
    meta: Any = None
    ranks: dict[str, list[Any]] = {}
    for rank, (header, nodes) in read.items():
        where = str(files[rank])
        stated = _attr(header, RANK_ATTR)
        if stated != rank:
            raise ConfigError(f"{where}: holds rank {stated}'s trace (parasim.rank), not rank "
                              f"{rank}'s its name says")
        own = _json(_attr(header, META_ATTR), f"{where}: GlobalMetadata {META_ATTR}")
        if meta is None:
            meta = own
        elif own != meta:
            raise ConfigError(f"{where}: {META_ATTR} differs from {files[min(read)].name}'s; a "
                              "folder holds the files of one export")
        ops = _op_objects(nodes, where)
        for index, (node, raw) in enumerate(zip(nodes, ops, strict=True)):
            if not isinstance(raw, dict):
                raise ConfigError(f"{where}: node {node.id}: {OP_ATTR} is not an object")
            if node.id != index or list(node.data_deps) != raw.get("deps", []):
                raise ConfigError(f"{where}: node {node.id}: its id or data_deps disagree "
                                  f"with its {OP_ATTR} (edited by another tool?)")
        ranks[str(rank)] = ops
    return from_json({"schema": SCHEMA, "version": VERSION, "meta": meta, "ranks": ranks},
                     label)


def _op_objects(nodes: Nodes, where: str) -> list[Any]:
    """Every node's `parasim.op`, parsed: as one JSON array (a tenth of the time of one parse
    per node), else node by node, so that the error names the node."""
    texts = []
    for node in nodes:
        last = node.attr[-1] if node.attr else None  # where the export puts it
        text = last.string_val if last is not None and last.name == OP_ATTR else \
            _attr(node, OP_ATTR)
        if not isinstance(text, str) or not text:
            raise ConfigError(f"{where}: node {node.id}: no {OP_ATTR} (every node of a "
                              "parasim export has one)")
        texts.append(text)
    try:
        ops = json.loads(f"[{','.join(texts)}]")
    except ValueError:
        ops = None
    if not isinstance(ops, list) or len(ops) != len(nodes):
        ops = [_json(text, f"{where}: node {node.id} {OP_ATTR}")
               for node, text in zip(nodes, texts, strict=True)]
    return ops


def _json(text: Any, where: str) -> Any:
    if not isinstance(text, str):
        raise ConfigError(f"{where}: missing (every node of a parasim export has one)")
    try:
        return json.loads(text)
    except ValueError:
        raise ConfigError(f"{where}: not JSON") from None


# --- anyone's Chakra trace -------------------------------------------------------------------

def _groups(path: Path) -> dict[str, list[int]] | None:
    """`comm_group.json` beside the files: pg_name -> ranks (None when there is none)."""
    if not path.is_file():
        return None
    raw = gunzip(read_bytes(path, limit=MAX_TRACE_BYTES), str(path), MAX_TRACE_BYTES)
    try:
        table = json.loads(raw)
    except ValueError:
        raise ConfigError(f"{path}: not JSON") from None
    if not isinstance(table, dict) or not all(
            isinstance(v, list) and all(type(r) is int for r in v) for v in table.values()):
        raise ConfigError(f"{path}: must map each pg_name to a list of ranks")
    return table


def _theirs(read: Mapping[int, tuple[Any, Nodes]], files: Mapping[int, Path],
            groups: Mapping[str, list[int]] | None, label: str) -> Trace:
    world = sorted(read)
    ranks = {str(rank): _rank_ops(nodes, rank, world, groups, str(files[rank]))
             for rank, (_, nodes) in read.items()}
    return from_json({"schema": SCHEMA, "version": VERSION, "meta": {}, "ranks": ranks},
                     label)


def _rank_ops(nodes: Nodes, rank: int, world: list[int],
              groups: Mapping[str, list[int]] | None, label: str) -> list[dict[str, Any]]:
    index: dict[int, int] = {}
    stream_of: list[str] = []
    tails: dict[str, int] = {}
    ops = []
    for i, node in enumerate(nodes):
        if node.id in index:
            raise ConfigError(f"{label}: node id {node.id} twice")
        deps, ctrl = (_earlier(node, ids, index, label) for ids in (node.data_deps,
                                                                    node.ctrl_deps))
        op = _op(node, rank, world, groups, label)
        stream = _attr(node, "stream")
        if not isinstance(stream, str) or not stream:
            stream = "compute" if op["kind"] == "compute" else next(
                (stream_of[d] for d in ctrl if tails.get(stream_of[d]) == d), f"comm.{i}")
        after = tails.get(stream)
        extra = [d for d in ctrl if d != after and d not in deps]
        if deps or extra:
            op["deps"] = list(dict.fromkeys(deps + extra))
        op["stream"] = stream
        index[node.id] = i
        stream_of.append(stream)
        tails[stream] = i
        ops.append(op)
    return ops


def _earlier(node: Any, ids: Any, index: Mapping[int, int], label: str) -> list[int]:
    out = []
    for dep in ids:
        if dep not in index:
            raise ConfigError(f"{label}: node {node.id} depends on node {dep}, which is not an "
                              "earlier node of the file (parasim reads nodes in dependency "
                              "order)")
        out.append(index[dep])
    return out


def _op(node: Any, rank: int, world: list[int], groups: Mapping[str, list[int]] | None,
        label: str) -> dict[str, Any]:
    """The op dict (`traces.io`'s fields) of one node, from Chakra's fields only."""
    kind = node.type
    op: dict[str, Any] = {"name": node.name}
    if kind in (NodeType.COMP_NODE, NodeType.METADATA_NODE):
        op["kind"] = "compute"
        if kind == NodeType.COMP_NODE:
            op["flops"] = float(_integer(node, "num_ops", label, 0))
            op["mem_bytes"] = float(_integer(node, "tensor_size", label, 0))
        if node.duration_micros > 0:
            op["start"] = node.start_time_micros / _MICROS
            op["end"] = (node.start_time_micros + node.duration_micros) / _MICROS
        return op
    op["size_bytes"] = float(_integer(node, "comm_size", label))
    if kind == NodeType.COMM_COLL_NODE:
        code = _integer(node, "comm_type", label)
        if code not in _KINDS:
            what = CommType(code).name if code in CommType._value2member_map_ else str(code)
            raise ConfigError(f"{label}: node {node.id}: comm_type {what} is a collective "
                              "parasim does not model")
        op["kind"] = _KINDS[CommType(code)]
        op["group"] = _group(node, world, groups, label)
        return op
    if kind in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
        send = kind == NodeType.COMM_SEND_NODE
        op["kind"] = "send" if send else "recv"
        op["peer"] = _integer(node, "comm_dst" if send else "comm_src", label)
        op["tag"] = str(_integer(node, "comm_tag", label, 0))
        return op
    what = NodeType(kind).name if kind in NodeType._value2member_map_ else str(kind)
    raise ConfigError(f"{label}: node {node.id}: a {what}, which parasim does not model")


def _group(node: Any, world: list[int], groups: Mapping[str, list[int]] | None,
           label: str) -> list[int]:
    name = _attr(node, "pg_name")
    if groups is None or name is None:
        return world
    if str(name) not in groups:
        raise ConfigError(f"{label}: node {node.id}: pg_name {show(name)} is not in "
                          f"{GROUPS_FILE}")
    return groups[str(name)]

