"""What one profiler event says about a collective: its kind, buffer size, dtype and group.

A collective shows up in a kineto trace as several events, each stating part of it:

    record_param_comms          args "Collective name", "In/Out msg nelems", "dtype",
                                "Process Group Ranks" (torch >= 2.2; older ones: no args)
    NCCL kernel                 the same args on newer traces; its name ("AllReduce") always
    c10d::allreduce_ and kin    the dispatcher op; with record_shapes its "Input Dims"
    nccl:all_reduce, gloo:*     the backend's annotation; "Input Dims"/"Input type" of its inputs

Each parser here turns one event into `Facts` (None where the event is silent), and `merge`
takes every field from the most reliable event that states it (the order above).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from traces.ops import OpKind

BARRIER = "barrier"
"""A barrier: replayed as an all-reduce without payload (size 0, measured duration kept)."""
WAIT = "wait"
"""Waiting for an earlier collective: no collective of its own."""

_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::", "nccl:", "gloo:")
# A collective's name, letters only, lower case, tried as prefixes in this order.
_KINDS: tuple[tuple[str, str], ...] = (
    ("allreduce", OpKind.ALL_REDUCE), ("allgather", OpKind.ALL_GATHER),
    ("reducescatter", OpKind.REDUCE_SCATTER), ("alltoall", OpKind.ALL_TO_ALL),
    ("broadcast", OpKind.BROADCAST), ("send", OpKind.SEND), ("recv", OpKind.RECV),
    ("barrier", BARRIER), ("monitoredbarrier", BARRIER), ("wait", WAIT),
)
# NCCL kernel names: ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_AllGather_RING_LL.
_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_KERNEL_KINDS = {"AllReduce": OpKind.ALL_REDUCE, "AllGather": OpKind.ALL_GATHER,
                 "ReduceScatter": OpKind.REDUCE_SCATTER, "Broadcast": OpKind.BROADCAST}
# "SendRecv" kernels run all_to_all, send and recv alike: the kind comes from the host side.

# Dispatcher ops: (argument index of the buffer, whether its numel is one rank's share, so the
# nccl-tests buffer is that times the group size). all_gather counts its output, reduce_scatter
# its input, the rest their one buffer (torch/csrc/distributed/c10d/Ops.cpp signatures).
_ISSUE_BUFFERS: dict[str, tuple[int, bool]] = {
    "allreduce_": (0, False), "allreduce_coalesced_": (0, False), "broadcast_": (0, False),
    "allgather_": (1, True), "allgather_coalesced_": (1, True), "_allgather_base_": (0, False),
    "allgather_into_tensor_coalesced_": (0, False), "reduce_scatter_": (0, True),
    "_reduce_scatter_base_": (1, False), "reduce_scatter_tensor_coalesced_": (1, False),
    "alltoall_base_": (1, False), "alltoall_": (1, False), "send": (0, False),
    "recv_": (0, False), "recv_any_source_": (0, False),
    # _c10d_functional (torch.compile, FSDP2, DTensor): the input is the first argument.
    "all_reduce": (0, False), "all_reduce_": (0, False), "all_reduce_coalesced": (0, False),
    "all_reduce_coalesced_": (0, False), "all_gather_into_tensor": (0, True),
    "all_gather_into_tensor_out": (0, True), "all_gather_into_tensor_coalesced": (0, True),
    "reduce_scatter_tensor": (0, False), "reduce_scatter_tensor_coalesced": (0, False),
    "all_to_all_single": (0, False), "broadcast": (0, False),
}
_PEER_ARG = 2  # c10d::send(tensors, pg, dstRank, tag), c10d::recv_(tensors, pg, srcRank, tag)

# (parasim name, bytes) by the profiler's spelling, normalized: lower case, no "c10::", no
# spaces. record_param_comms writes ScalarType names ("Float", "BFloat16"), "Input type" C++
# names ("float", "c10::BFloat16", "long int").
_DTYPES: dict[str, tuple[str, int]] = {
    "float": ("fp32", 4), "float32": ("fp32", 4), "double": ("fp64", 8), "float64": ("fp64", 8),
    "half": ("fp16", 2), "float16": ("fp16", 2), "bfloat16": ("bf16", 2),
    "float8_e4m3fn": ("fp8_e4m3", 1), "float8_e4m3fnuz": ("fp8_e4m3", 1),
    "float8_e5m2": ("fp8_e5m2", 1), "float8_e5m2fnuz": ("fp8_e5m2", 1),
    "long": ("int64", 8), "longint": ("int64", 8), "int64": ("int64", 8),
    "int": ("int32", 4), "int32": ("int32", 4), "short": ("int16", 2), "shortint": ("int16", 2),
    "int16": ("int16", 2), "char": ("int8", 1), "signedchar": ("int8", 1), "int8": ("int8", 1),
    "byte": ("uint8", 1), "unsignedchar": ("uint8", 1), "uint8": ("uint8", 1),
    "bool": ("bool", 1), "complexfloat": ("complex64", 8), "complex<float>": ("complex64", 8),
    "complexdouble": ("complex128", 16), "complex<double>": ("complex128", 16),
}
DTYPE_BYTES = {name: size for name, size in _DTYPES.values()}


@dataclass(slots=True)
class Facts:
    """What the events of one collective state; None where they are silent."""

    name: str | None = None
    """The collective's name as the trace spells it, prefix and trailing '_' removed."""
    kind: str | None = None
    """An OpKind value, BARRIER, WAIT, or '' for a collective parasim does not model."""
    numel: int | None = None
    per_rank: bool = False
    """`numel` is one rank's share: the buffer is numel times the group size."""
    dtype: str | None = None
    """parasim's name (fp32, bf16, ...) or the trace's own spelling when unknown here."""
    group: tuple[int, ...] | None = None
    pg_name: str | None = None
    peer: int | None = None
    """Send/recv: the other side's rank within the group."""

    def size_bytes(self, group_size: int) -> float:
        """The nccl-tests buffer size, or 0.0 when the trace does not state it."""
        if self.kind == BARRIER or self.numel is None or self.dtype not in DTYPE_BYTES:
            return 0.0
        return float(self.numel * (group_size if self.per_rank else 1) * DTYPE_BYTES[self.dtype])


def merge(facts: Sequence[Facts]) -> Facts:
    """Each field from the first `Facts` that states it (numel with its per_rank flag).

    Sizes are taken only from events of the collective's own kind: gloo runs a reduce_scatter
    as all_reduces, whose inputs are not the reduce_scatter's buffer (but share its dtype).
    """
    out = Facts(kind=next((f.kind for f in facts if f.kind is not None), None))
    for fact in facts:
        for name in ("name", "dtype", "group", "pg_name", "peer"):
            if getattr(out, name) is None:
                setattr(out, name, getattr(fact, name))
        if fact.kind not in (None, out.kind):
            continue
        if out.numel is None and fact.numel is not None:
            out.numel, out.per_rank = fact.numel, fact.per_rank
    return out


def kind_of(name: str) -> str:
    """The kind a collective's name stands for ('' when parasim does not model it)."""
    letters = re.sub(r"[^a-z]", "", name.lower())
    for prefix, kind in _KINDS:
        if letters.startswith(prefix):
            return kind
    return ""


def short_name(name: str) -> str:
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return name.rstrip("_") or name


def dtype_name(raw: object) -> str | None:
    if not isinstance(raw, str) or not raw:
        return None
    key = raw.lower().replace("c10::", "").replace(" ", "")
    known = _DTYPES.get(key)
    return known[0] if known else raw


# --- one parser per kind of event --------------------------------------------------------------

def from_record(args: Mapping[str, Any]) -> Facts:
    """record_param_comms, or an NCCL kernel carrying the same args."""
    name = args.get("Collective name")
    facts = Facts()
    if isinstance(name, str) and name:
        facts.name, facts.kind = short_name(name), kind_of(name)
    sizes = [n for n in map(_int, (args.get("In msg nelems"), args.get("Out msg nelems")))
             if n is not None]
    if sizes:
        # nccl-tests' buffer is the larger side: all_gather's output, reduce_scatter's input.
        facts.numel = max(sizes)
    facts.dtype = dtype_name(args.get("dtype"))
    facts.group = _ranks(args)
    pg_name = args.get("Process Group Name")
    facts.pg_name = pg_name if isinstance(pg_name, str) and pg_name else None
    return facts


def from_issue(name: str, args: Mapping[str, Any]) -> Facts:
    """A dispatcher op such as c10d::allreduce_ (sizes only when recorded with shapes)."""
    short = name.split("::", 1)[-1]
    facts = Facts(name=short_name(name), kind=kind_of(short))
    buffer = _ISSUE_BUFFERS.get(short)
    dims, types = args.get("Input Dims"), args.get("Input type")
    if buffer is not None and isinstance(dims, list) and buffer[0] < len(dims):
        arg_type = types[buffer[0]] if isinstance(types, list) and buffer[0] < len(types) else ""
        facts.numel = _numel(dims[buffer[0]], arg_type)
        facts.per_rank = buffer[1]
        facts.dtype = None if arg_type in ("TensorList", "") else dtype_name(arg_type)
    if facts.kind in (OpKind.SEND, OpKind.RECV):
        facts.peer = _concrete_int(args, _PEER_ARG)
    if short in _ISSUE_BUFFERS and name.startswith(("_c10d_functional", "c10d_functional")):
        facts.pg_name = _concrete_str(args, -1)  # the group_name argument comes last
    return facts


def from_backend(name: str, args: Mapping[str, Any]) -> Facts:
    """nccl:all_reduce, gloo:all_gather, ...: the backend's own record of its inputs."""
    facts = Facts(name=short_name(name), kind=kind_of(short_name(name)))
    dims, types = args.get("Input Dims"), args.get("Input type")
    if isinstance(dims, list) and isinstance(types, list) and dims and len(types) == len(dims):
        numels = [_numel(d, t) for d, t in zip(dims, types)]
        if all(n is not None for n in numels):
            facts.numel = sum(n for n in numels if n is not None)
            facts.per_rank = facts.kind == OpKind.ALL_GATHER  # each rank's input
        dtypes = {dtype_name(t) for t in types}
        facts.dtype = dtypes.pop() if len(dtypes) == 1 else None
    return facts


def from_kernel_name(name: str) -> Facts:
    match = _NCCL_KERNEL.match(name)
    if match is None:
        return Facts()
    return Facts(name=match.group(1), kind=_KERNEL_KINDS.get(match.group(1)))


def is_nccl_kernel(name: str) -> bool:
    return _NCCL_KERNEL.match(name) is not None


# --- argument readers: anything malformed reads as "not stated" --------------------------------

def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _int(value: object) -> int | None:
    """A count (a non-negative integer; bool is not one), else None."""
    return value if type(value) is int and value >= 0 else None


def _numel(dims: object, arg_type: object) -> int | None:
    """Elements of a tensor ([8, 1024]) or a tensor list ([[808], [32]]); None if not a tensor.

    A tensor list recorded without its shapes (older torch: dims [] and type 'TensorList') is
    not stated; a tensor with dims [] is a scalar, one element.
    """
    if not isinstance(dims, list) or not isinstance(arg_type, str) or arg_type in ("", "Scalar"):
        return None
    if arg_type == "TensorList":
        if not dims or not all(isinstance(d, list) for d in dims):
            return None
        sizes = [_numel(d, "tensor") for d in dims]
        return None if None in sizes else sum(s for s in sizes if s is not None)
    if not all(_count(d) for d in dims):
        return None
    return math.prod(dims)


def _ranks(args: Mapping[str, Any]) -> tuple[int, ...] | None:
    """Global ranks of the group: "Process Group Ranks", else start/stride/size."""
    raw = args.get("Process Group Ranks")
    if isinstance(raw, str):
        try:
            raw = ast.literal_eval(raw) if len(raw) < 1_000_000 else None
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raw = None
    if isinstance(raw, list | tuple) and raw and all(_count(r) for r in raw):
        return tuple(raw)
    start, stride, size = (_int(args.get(k)) for k in ("Global rank start",
                                                        "Global rank stride", "Group size"))
    if start is not None and stride and size:
        return tuple(range(start, start + stride * size, stride))
    return None


def _concrete(args: Mapping[str, Any], index: int) -> str | None:
    values = args.get("Concrete Inputs")
    if not isinstance(values, Sequence) or isinstance(values, str) or not values:
        return None
    if not -len(values) <= index < len(values):
        return None
    value = values[index]
    return value if isinstance(value, str) and value else None


def _concrete_int(args: Mapping[str, Any], index: int) -> int | None:
    value = _concrete(args, index)
    return int(value) if value is not None and value.isdigit() and len(value) < 10 else None


def _concrete_str(args: Mapping[str, Any], index: int) -> str | None:
    return _concrete(args, index)
