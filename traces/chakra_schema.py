"""MLCommons Chakra's execution-trace schema, built at run time, and its file framing.

The schema is Chakra's `et_def.proto` (package `ChakraProtoMsg`), as of mlcommons/chakra commit
6dc63e147b9d115286626cc122459e44d9d08401, `schema/protobuf/et_def.proto`: the messages
`GlobalMetadata`, `Node`, `AttributeProto` (a name and one typed value), the value lists and
`IOInfo`, with their field numbers and types; the newer `Node.storage` (field 11) is left out
and kept as an unknown field when a file holds it. A `.et` file is one `GlobalMetadata` and then
`Node`s, each preceded by its length as a varint, as Chakra's own reader and writer frame them
(`src/third_party/utils/protolib.py`: `encodeMessage`, `decodeMessage`; a zero length or the
end of the file ends it).

Why the descriptor is built here instead of checking in a generated `et_def_pb2.py`: generated
code is tied to the protobuf runtime that made it (protobuf >= 5.26 refuses gencode newer than
itself), needs protoc to regenerate, and would be a copy of another project's file; this table
states only the field numbers, which are the wire format, and works with any protobuf >= 4.25.
It lives in a private descriptor pool, so it never clashes with Chakra's own `et_def_pb2` loaded
in the same process. `protobuf` is the optional extra `parasim[chakra]`; without it every entry
point says so in one line (exit 2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from traces.errors import ConfigError

INSTALL_HINT = "Chakra traces need protobuf: pip install parasim[chakra]"
CHAKRA_COMMIT = "6dc63e147b9d115286626cc122459e44d9d08401"
ET_VERSION = "0.0.4"
"""The `GlobalMetadata.version` Chakra's generator writes."""


class NodeType(IntEnum):
    """`ChakraProtoMsg.NodeType`."""

    INVALID_NODE = 0
    METADATA_NODE = 1
    MEM_LOAD_NODE = 2
    MEM_STORE_NODE = 3
    COMP_NODE = 4
    COMM_SEND_NODE = 5
    COMM_RECV_NODE = 6
    COMM_COLL_NODE = 7
    STORAGE_NODE = 8
    BATCH_NODE = 9
    CHECKPOINT_NODE = 10


class CommType(IntEnum):
    """`ChakraProtoMsg.CollectiveCommType`: a collective node's `comm_type` attribute."""

    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


# AttributeProto's `value` oneof: (scalar type, field number of the value, of its list).
_VALUE_TYPES = (("double", 3), ("float", 5), ("int32", 7), ("int64", 9), ("uint32", 11),
                ("uint64", 13), ("sint32", 15), ("sint64", 17), ("fixed32", 19),
                ("fixed64", 21), ("sfixed32", 23), ("sfixed64", 25), ("bool", 27),
                ("string", 29), ("bytes", 31))
INTEGER_VALUES = tuple(f"{t}_val" for t, _ in _VALUE_TYPES if "int" in t or "fixed" in t)
"""The attribute fields that hold one integer (producers differ in which they use)."""


@dataclass(frozen=True, slots=True)
class Messages:
    """The message classes of the schema."""

    GlobalMetadata: Any
    Node: Any
    AttributeProto: Any
    decode_error: type[Exception]


def _field(proto: Any, name: str, number: int, kind: str, *, repeated: bool = False,
           type_name: str = "", oneof: int | None = None) -> None:
    from google.protobuf import descriptor_pb2

    field = proto.field.add(name=name, number=number)
    field.type = getattr(descriptor_pb2.FieldDescriptorProto, f"TYPE_{kind.upper()}")
    field.label = (descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if repeated
                   else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    if type_name:
        field.type_name = f".ChakraProtoMsg.{type_name}"
    if oneof is not None:
        field.oneof_index = oneof


@functools.cache
def messages() -> Messages:
    """The schema's classes (protobuf imported here, on first use: the extra is optional)."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        from google.protobuf.message import DecodeError
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    file = descriptor_pb2.FileDescriptorProto(name="parasim/chakra_et_def.proto",
                                              package="ChakraProtoMsg", syntax="proto3")
    attribute = file.message_type.add(name="AttributeProto")
    _field(attribute, "name", 1, "string")
    _field(attribute, "doc_string", 2, "string")
    attribute.oneof_decl.add(name="value")
    for kind, number in _VALUE_TYPES:
        listed = f"{kind.capitalize()}List"
        _field(file.message_type.add(name=listed), "values", 1, kind, repeated=True)
        _field(attribute, f"{kind}_val", number, kind, oneof=0)
        _field(attribute, f"{kind}_list", number + 1, "message", type_name=listed, oneof=0)
    metadata = file.message_type.add(name="GlobalMetadata")
    _field(metadata, "version", 1, "string")
    _field(metadata, "attr", 2, "message", repeated=True, type_name="AttributeProto")
    node_type = file.enum_type.add(name="NodeType")
    for member in NodeType:
        node_type.value.add(name=member.name, number=member.value)
    io_info = file.message_type.add(name="IOInfo")
    for number, name in enumerate(("values", "shapes", "types"), start=1):
        _field(io_info, name, number, "string")
    node = file.message_type.add(name="Node")
    for name, number, kind in (("id", 1, "uint64"), ("name", 2, "string")):
        _field(node, name, number, kind)
    _field(node, "type", 3, "enum", type_name="NodeType")
    _field(node, "ctrl_deps", 4, "uint64", repeated=True)
    _field(node, "data_deps", 5, "uint64", repeated=True)
    _field(node, "start_time_micros", 6, "uint64")
    _field(node, "duration_micros", 7, "uint64")
    _field(node, "inputs", 8, "message", type_name="IOInfo")
    _field(node, "outputs", 9, "message", type_name="IOInfo")
    _field(node, "attr", 10, "message", repeated=True, type_name="AttributeProto")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)

    def make(name: str) -> Any:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(
            f"ChakraProtoMsg.{name}"))

    return Messages(make("GlobalMetadata"), make("Node"), make("AttributeProto"), DecodeError)


# --- framing ---------------------------------------------------------------------------------

def varint(value: int) -> bytes:
    """`value` as a protobuf base-128 varint (the length prefix of each message)."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(0x80 | low)


def frames(data: bytes, label: str) -> list[bytes]:
    """The messages of a `.et` file's bytes, in order; a length running past the end (a
    truncated file) or a varint over 10 bytes is one line naming the file and the offset."""
    out: list[bytes] = []
    at, end = 0, len(data)
    while at < end:
        size = shift = 0
        start = at
        while True:
            if at >= end or shift > 63:
                raise ConfigError(f"{label}: not a Chakra ET file: bad length prefix at byte "
                                  f"{start}")
            byte = data[at]
            at += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if size == 0:  # Chakra's reader stops at a zero length
            break
        if at + size > end:
            what = "not a Chakra ET file (or truncated)" if start == 0 else "truncated"
            raise ConfigError(f"{label}: {what}: a message at byte {start} claims "
                              f"{size:,} bytes, {end - at:,} are left")
        out.append(data[at:at + size])
        at += size
    return out
