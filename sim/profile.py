"""Calibration profiles: how close to the roofline each class of op runs, as a JSON file.

A compute op named `attn`, `mlp`, `norm`, `head`, `embed`, `attn_core` or `optimizer` costs
(`sim.compute`) max(FLOPs / (peak * flops_efficiency), bytes / (HBM * memory_efficiency))
+ overhead_s. Calibration against measured traces will fit these; until then each preset
accelerator has defaults taken from public kernel benchmarks (cited below), not from any
end-to-end throughput table. A profile file is JSON, read through `traces.files` and
`traces.fields`: an unknown op name, an efficiency outside (0, 1] or an overhead that is not a
finite 0 to 1 s is one error line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from topology.cluster import Accelerator
from traces.errors import ConfigError, check_keys, show
from traces.fields import MAX_LATENCY_S, Fields, check_fraction, check_number
from traces.files import load_json, write_text_atomic

VERSION = 1
KERNEL_NAMES = ("embed", "pos_embed", "ln1", "qkv", "flash_attn", "qk", "softmax",
                "attn_dropout", "av", "proj", "bda1", "ln2", "fc1", "gelu", "fc2", "bda2",
                "final_ln", "logits", "cross_entropy", "optimizer")
"""The compute op names a plan holds (`traces.kernels`, `traces.plan.compute`)."""
CLASS_NAMES = ("attn", "mlp", "norm", "head", "attn_core")
"""The op classes of the plans before kernel-level ops, which `DEFAULTS` below still costs."""
OP_NAMES = (*KERNEL_NAMES, *CLASS_NAMES)
"""The names a profile may cost; any other is a typo that would silently cost nothing."""
PROFILE_KEYS = ("schema", "version", "name", "default", "ops")
COST_KEYS = ("flops_efficiency", "memory_efficiency", "overhead_s")


@dataclass(frozen=True, slots=True)
class OpCost:
    flops_efficiency: float
    """Achieved fraction of dense peak FLOP/s."""
    memory_efficiency: float
    """Achieved fraction of HBM bandwidth."""
    overhead_s: float = 0.0
    """Fixed time per op (launches, framework)."""

    def __post_init__(self) -> None:
        check_fraction(self.flops_efficiency, "flops_efficiency")
        check_fraction(self.memory_efficiency, "memory_efficiency")
        check_number(self.overhead_s, "overhead_s", minimum=0.0, maximum=MAX_LATENCY_S,
                     unit=" s")


@dataclass(frozen=True, kw_only=True)
class Profile:
    name: str
    ops: Mapping[str, OpCost] = field(default_factory=dict)
    default: OpCost = OpCost(0.7, 0.8)

    def __post_init__(self) -> None:
        check_keys(self.ops, OP_NAMES, "profile.ops")  # a typo would silently cost nothing

    def cost(self, op_name: str) -> OpCost:
        return self.ops.get(op_name, self.default)

    def to_json(self) -> dict[str, object]:
        return {"schema": "parasim.profile", "version": VERSION, "name": self.name,
                "default": asdict(self.default),
                "ops": {k: asdict(v) for k, v in self.ops.items()}}

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n")


def load_profile(path: str | Path) -> Profile:
    """Read and check a profile file (see `profile_from_json`)."""
    return profile_from_json(load_json(path, what="--profile"), f"--profile: {path}")


def profile_from_json(data: object, source: str = "profile") -> Profile:
    """A profile from its JSON object; every bad key or value is one ConfigError line."""
    if not isinstance(data, dict) or data.get("schema") != "parasim.profile":
        raise ConfigError(f"{source}: not a parasim profile (schema parasim.profile)")
    if type(data.get("version")) is not int or data["version"] != VERSION:
        raise ConfigError(f"{source}: has version {show(data.get('version'))}; "
                          f"this parasim reads version {VERSION}")
    fields = Fields(data, "profile")
    try:
        fields.known(PROFILE_KEYS)
        if "default" not in fields:
            raise ConfigError("profile.default: missing (an object of "
                              f"{', '.join(COST_KEYS[:2])})")
        ops = fields.sub("ops").known(OP_NAMES)
        return Profile(name=fields.string("name", str(source)),
                       ops={name: _cost(ops.sub(name)) for name in ops.table},
                       default=_cost(fields.sub("default")))
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def _cost(fields: Fields) -> OpCost:
    fields.known(COST_KEYS)
    for key in COST_KEYS[:2]:
        if key not in fields:
            raise ConfigError(f"{fields.name(key)}: missing")
    return OpCost(fields.fraction("flops_efficiency", 1.0),
                  fields.fraction("memory_efficiency", 1.0),
                  fields.number("overhead_s", 0.0, minimum=0.0, maximum=MAX_LATENCY_S,
                                unit=" s"))


# Defaults per accelerator. Sources:
# - large bf16 GEMMs (the MLP, the logits): cuBLAS reaches ~85% of dense peak on A100 and ~70% on
#   H100 SXM at Megatron-sized shapes (NVIDIA "Matrix Multiplication Background" guide and
#   public cuBLAS benchmarks);
# - attention blocks (QKV/proj GEMMs plus flash attention): FlashAttention-2 (Dao, 2023) reaches
#   50-73% of A100 peak and ~35-50% of H100 peak; we take 0.65 and 0.50;
# - memory-bound kernels reach ~80% of HBM bandwidth (STREAM-like copies on HBM2e/HBM3);
# - TPU v4: PaLM (Chowdhery et al., 2022) ran at 57.8% hardware FLOPs utilisation end to end, so
#   per-op MXU efficiency is at least that; we take 0.75 for matmuls, 0.6 for attention.
_GPU_A100 = {"mlp": OpCost(0.85, 0.8), "head": OpCost(0.85, 0.8), "attn": OpCost(0.65, 0.8),
             "attn_core": OpCost(0.65, 0.8)}
_GPU_H100 = {"mlp": OpCost(0.70, 0.8), "head": OpCost(0.70, 0.8), "attn": OpCost(0.50, 0.8),
             "attn_core": OpCost(0.50, 0.8)}
_TPU_V4 = {"mlp": OpCost(0.75, 0.8), "head": OpCost(0.75, 0.8), "attn": OpCost(0.60, 0.8),
           "attn_core": OpCost(0.60, 0.8)}
DEFAULTS: dict[str, Mapping[str, OpCost]] = {
    "A100-SXM4-80GB": _GPU_A100,
    "H100-SXM5-80GB": _GPU_H100,
    "H200-SXM-141GB": _GPU_H100,  # same Hopper compute die as H100
    "TPU-v4": _TPU_V4,
}


def default_profile(accelerator: Accelerator) -> Profile:
    """The built-in profile for a preset accelerator (generic 0.7 / 0.8 for unknown ones)."""
    ops = DEFAULTS.get(accelerator.name, {})
    return Profile(name=f"default-{accelerator.name}", ops=ops, default=OpCost(0.7, 0.8))
