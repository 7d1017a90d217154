"""An op's purpose in a trace file: a small JSON object, written and read in one place.

    {"type": "tp", "kernel": "proj", "slot": "attn", "grad": false, "kind": "all_reduce",
     "saved": false}
    {"type": "grad_bucket", "index": 0, "round": 3}       {"type": "unit_gather", "unit": 5}

"type" names the purpose (`TYPES`); the other keys are its fields, enums as their values and a
`Unit` as its layer index or "embed" / "head". Both directions cache per distinct purpose: a
large plan holds ~10^6 ops but a few thousand distinct purposes, and loading one stays a dict
lookup per op. A malformed purpose raises `ValueError` with the rule (`traces.io` adds where).
"""

from __future__ import annotations

from dataclasses import fields
from enum import StrEnum
from typing import Any

from traces.kinds import OpKind
from traces.purpose import (
    EMBED,
    HEAD,
    PURPOSES,
    AmaxReduction,
    Bench,
    BenchRole,
    CpGather,
    CpRing,
    CrossEntropyStat,
    EmbeddingGrads,
    ExpertAllToAll,
    ExpertGrads,
    ExpertParamGather,
    ExpertTp,
    ExpertUnitGather,
    GemmChunk,
    GemmPart,
    GradBucket,
    GradStat,
    HostCopy,
    Kernel,
    KernelRun,
    MessageGather,
    MoeStep,
    OverlapMethod,
    ParamGather,
    Part,
    PipeMessage,
    Purpose,
    RoutingMapGather,
    SpGrads,
    Stat,
    StepStat,
    Tag,
    TpChunk,
    TpSite,
    Unit,
    UnitGather,
    UnitGradReduce,
)

TYPES: dict[str, type] = {
    "kernel": KernelRun, "tp": TpSite, "message_gather": MessageGather,
    "cross_entropy": CrossEntropyStat, "sp_grads": SpGrads, "grad_bucket": GradBucket,
    "unit_gather": UnitGather, "unit_grad_reduce": UnitGradReduce,
    "param_gather": ParamGather, "embedding_grads": EmbeddingGrads, "grad_stat": GradStat,
    "pipe": PipeMessage, "amax": AmaxReduction, "cp_ring": CpRing, "cp_gather": CpGather,
    "bench": Bench, "gemm_chunk": GemmChunk, "tp_chunk": TpChunk,
    "expert_all_to_all": ExpertAllToAll, "expert_tp": ExpertTp, "expert_grads": ExpertGrads,
    "expert_params": ExpertParamGather, "expert_unit_gather": ExpertUnitGather,
    "host_copy": HostCopy, "routing_map_gather": RoutingMapGather,
}
assert set(TYPES.values()) == set(PURPOSES), "every purpose has a JSON type"
_TYPE_OF = {cls: name for name, cls in TYPES.items()}
_ENUMS: dict[str, type[StrEnum]] = {"Kernel": Kernel, "OpKind": OpKind, "Tag": Tag,
                                    "Stat": Stat, "StepStat": StepStat, "BenchRole": BenchRole,
                                    "GemmPart": GemmPart, "OverlapMethod": OverlapMethod,
                                    "MoeStep": MoeStep}
_FIELDS = {cls: tuple((f.name, str(f.type)) for f in fields(cls)) for cls in PURPOSES}
_UNITS = {"embed": EMBED, "head": HEAD}

_encoded: dict[Purpose, dict[str, Any]] = {}
_decoded: dict[tuple[tuple[str, Any], ...], Purpose] = {}


def encode(purpose: Purpose) -> dict[str, Any]:
    """The JSON object of a purpose (shared between ops: never mutate it)."""
    out = _encoded.get(purpose)
    if out is None:
        out = {"type": _TYPE_OF[type(purpose)]}
        for name, _ in _FIELDS[type(purpose)]:
            value = getattr(purpose, name)
            out[name] = _encode_unit(value) if isinstance(value, Unit) else \
                str(value) if isinstance(value, StrEnum) else value
        _encoded[purpose] = out
    return out


def decode(value: object) -> Purpose:
    """The purpose a JSON object states; ValueError naming the rule it breaks."""
    if type(value) is not dict:
        raise ValueError(f"must be an object with a \"type\", got {type(value).__name__}")
    try:
        key = tuple(value.items())
        found = _decoded.get(key)
    except TypeError:  # a list or an object inside: unhashable, and never valid
        key, found = (), None
    if found is None:
        found = _decode(value)
        if key:
            _decoded[key] = found
    return found


def _decode(value: dict[str, Any]) -> Purpose:
    cls = TYPES.get(value.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown purpose type {value.get('type')!r} (expected one of: "
                         f"{', '.join(TYPES)})")
    specs = _FIELDS[cls]
    unknown = sorted(set(value) - {"type"} - {name for name, _ in specs})
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} for purpose type {value['type']!r}")
    args = {}
    for name, kind in specs:
        if name not in value:
            if name == "saved" and cls is TpSite:  # TpSite's only defaulted field
                continue
            raise ValueError(f"purpose type {value['type']!r} needs {name!r}")
        args[name] = _field(value[name], kind, name)
    return cls(**args)  # type: ignore[no-any-return]


def _field(raw: object, kind: str, name: str) -> object:
    if kind in _ENUMS:
        enum = _ENUMS[kind]
        if type(raw) is not str or raw not in enum._value2member_map_:
            raise ValueError(f"{name}: {raw!r} is not one of {', '.join(map(str, enum))}")
        return enum(raw)
    if kind == "Unit":
        return _decode_unit(raw, name)
    if kind == "bool":
        if type(raw) is not bool:
            raise ValueError(f"{name}: must be true or false, got {raw!r}")
        return raw
    if kind == "int":
        if type(raw) is not int or raw < 0:
            raise ValueError(f"{name}: must be an integer >= 0, got {raw!r}")
        return raw
    assert kind == "str", kind
    if type(raw) is not str:
        raise ValueError(f"{name}: must be a string, got {raw!r}")
    return raw


def _encode_unit(unit: Unit) -> int | str:
    return unit.layer if unit.layer is not None else str(unit.part)


def _decode_unit(raw: object, name: str) -> Unit:
    if type(raw) is int and raw >= 0:
        return Unit(Part.LAYER, raw)
    unit = _UNITS.get(raw) if type(raw) is str else None
    if unit is None:
        raise ValueError(f"{name}: a unit is a layer index, \"embed\" or \"head\"; got {raw!r}")
    return unit
