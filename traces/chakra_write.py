"""A parasim trace as Chakra execution-trace files: one `<name>.<rank>.et` per rank.

Each op becomes one node (its id the op's index on its rank), stated in Chakra's own terms so
that ASTRA-sim and Chakra's tools read it:

* compute: `COMP_NODE`, `duration_micros` (the op's simulated or measured time), attributes
  `num_ops` (FLOPs) and `tensor_size` (bytes moved);
* a collective: `COMM_COLL_NODE`, `comm_type`, `comm_size` (bytes, as nccl-tests counts them)
  and `pg_name`, the process group, whose ranks `comm_group.json` beside the files lists (the
  `{"pg_name": [ranks]}` table ASTRA-sim's `--comm-group-configuration` reads);
* a send / receive: `COMM_SEND_NODE` / `COMM_RECV_NODE`, `comm_src`, `comm_dst`, `comm_size`,
  `comm_tag` (parasim's string tag numbered the same in every file);
* `data_deps`: the op's dependencies; `ctrl_deps`: the op before it on its stream (a stream
  runs in order: Chakra has no streams, so the order is a dependency), and the attribute
  `stream` names it (which tools that know no streams ignore).

Each attribute has the value type Chakra's feeder reads it as (ASTRA-sim reads the one field,
and a value in another field reads as 0): `num_ops`, `comm_size`, `comm_type` int64,
`tensor_size` uint64, `comm_src`, `comm_dst`, `comm_tag` int32, `pg_name` string, `is_cpu_op`
bool (mlcommons/chakra 02da5d056f2f9c2a994d1887ffba6ad4c7c99695, `src/feeder/et_feeder_node.cpp`).

Chakra cannot state the rest of an op (stream, purpose, layer, GEMM shape, exact times) nor the
trace's header: every node also carries the op as parasim writes it (`parasim.op`, the JSON of
`traces.io`), and `GlobalMetadata` the header (`parasim.meta`) and the ranks exported
(`parasim.ranks`), so parasim reads its own export
back exactly (`traces.chakra_read`) while other tools ignore both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from traces.chakra_schema import ET_VERSION, CommType, NodeType, messages, varint
from traces.io import to_json
from traces.ops import Op, OpKind, Trace

GROUPS_FILE = "comm_group.json"
META_ATTR = "parasim.meta"
OP_ATTR = "parasim.op"
RANK_ATTR = "parasim.rank"
RANKS_ATTR = "parasim.ranks"

_INT64 = 2**63 - 1
"""The most `num_ops` holds (parasim's bound on an op's FLOPs, a day at 1e17/s, is above)."""

COMM_TYPES = {OpKind.ALL_REDUCE: CommType.ALL_REDUCE, OpKind.ALL_GATHER: CommType.ALL_GATHER,
              OpKind.REDUCE_SCATTER: CommType.REDUCE_SCATTER,
              OpKind.BROADCAST: CommType.BROADCAST, OpKind.ALL_TO_ALL: CommType.ALL_TO_ALL}
"""parasim's collective kinds as Chakra's comm_type."""


def et_name(name: str, rank: int) -> str:
    """Chakra's file name for one rank's trace."""
    return f"{name}.{rank}.et"


def process_groups(trace: Trace) -> dict[tuple[int, ...], str]:
    """Every collective's group, named "1", "2", ... in sorted order (the same in every file)."""
    groups = sorted({op.group for ops in trace.ops.values() for op in ops
                     if op.kind.is_collective})
    return {group: str(number) for number, group in enumerate(groups, start=1)}


def groups_json(groups: Mapping[tuple[int, ...], str]) -> str:
    """`comm_group.json`: pg_name -> its ranks."""
    return json.dumps({name: list(group) for group, name in groups.items()}) + "\n"


dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
"""An op's JSON, compact (one encoder for every node)."""


def encode_trace(trace: Trace) -> Iterator[tuple[int, bytes]]:
    """(rank, the bytes of its `.et` file) for every rank of `trace`, in rank order."""
    m = messages()
    document = to_json(trace)
    meta = dumps(document["meta"])
    groups = process_groups(trace)
    tags = {tag: number for number, tag in enumerate(sorted(
        {op.tag for ops in trace.ops.values() for op in ops if op.kind.is_p2p}))}
    ranks = sorted(trace.ops)  # a folded plan's: the ranks that stand for all
    for rank in ranks:
        header = m.GlobalMetadata(version=ET_VERSION)
        header.attr.append(m.AttributeProto(name=META_ATTR, string_val=meta))
        header.attr.append(m.AttributeProto(name=RANK_ATTR, int64_val=rank))
        header.attr.append(m.AttributeProto(name=RANKS_ATTR, int64_list={"values": ranks}))
        out = [_framed(header)]
        raw_ops = document["ranks"][str(rank)]
        last_on: dict[str, int] = {}
        for index, (op, raw) in enumerate(zip(trace.ops[rank], raw_ops, strict=True)):
            fields = _fields(rank, index, op, groups, tags)
            before = last_on.get(op.stream)
            if before is not None:
                fields["ctrl_deps"] = (before,)
            last_on[op.stream] = index
            fields["attr"].append({"name": OP_ATTR, "string_val": dumps(raw)})
            out.append(_framed(m.Node(**fields)))
        yield rank, b"".join(out)


def _framed(message: Any) -> bytes:
    body = message.SerializeToString(deterministic=True)
    return varint(len(body)) + body


def _fields(rank: int, index: int, op: Op, groups: Mapping[tuple[int, ...], str],
            tags: Mapping[str, int]) -> dict[str, Any]:
    """The node's fields, as the keywords of `Node(...)` (dicts for the attributes: one
    constructor call per node takes half the time of building it piece by piece)."""
    attrs: list[dict[str, Any]] = [{"name": "is_cpu_op", "bool_val": False},
                                   {"name": "stream", "string_val": op.stream}]
    fields: dict[str, Any] = {"id": index, "name": op.name or str(op.kind),
                              "data_deps": op.deps, "attr": attrs}
    if op.start is not None and op.end is not None:
        fields["start_time_micros"] = round(op.start * 1e6)
        fields["duration_micros"] = round((op.end - op.start) * 1e6)
    if op.kind is OpKind.COMPUTE:
        fields["type"] = NodeType.COMP_NODE
        attrs += [{"name": "num_ops", "int64_val": min(round(op.flops), _INT64)},
                  {"name": "tensor_size", "uint64_val": min(round(op.mem_bytes), _INT64)}]
        return fields
    attrs.append({"name": "comm_size", "int64_val": round(op.size_bytes)})
    if op.kind.is_collective:
        fields["type"] = NodeType.COMM_COLL_NODE
        attrs += [{"name": "comm_type", "int64_val": COMM_TYPES[op.kind]},
                  {"name": "pg_name", "string_val": groups[op.group]}]
        return fields
    assert op.peer is not None, "a send or receive names its peer"
    send = op.kind is OpKind.SEND
    fields["type"] = NodeType.COMM_SEND_NODE if send else NodeType.COMM_RECV_NODE
    attrs += [{"name": "comm_src", "int32_val": rank if send else op.peer},
              {"name": "comm_dst", "int32_val": op.peer if send else rank},
              {"name": "comm_tag", "int32_val": tags[op.tag]}]
    return fields
