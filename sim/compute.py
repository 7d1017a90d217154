"""Compute time of one op: the roofline, with per-op-class efficiency from a profile.

    time = max(FLOPs / (peak * flops_efficiency), bytes / (HBM bandwidth * memory_efficiency))
           + overhead

A measured op (one that carries start/end, from a real run) keeps its measured duration.
"""

from __future__ import annotations

from sim.profile import Profile
from topology.cluster import Accelerator
from traces.ops import Op


class ComputeModel:
    """Roofline durations for one accelerator and profile, cached per (name, FLOPs, bytes)."""

    def __init__(self, accelerator: Accelerator, profile: Profile) -> None:
        self.accelerator = accelerator
        self.profile = profile
        self._cache: dict[tuple[str, float, float], float] = {}

    def duration(self, op: Op) -> float:
        if op.start is not None and op.end is not None:
            return op.end - op.start
        key = (op.name, op.flops, op.mem_bytes)
        seconds = self._cache.get(key)
        if seconds is None:
            seconds = self.roofline(*key)
            self._cache[key] = seconds
        return seconds

    def roofline(self, name: str, flops: float, mem_bytes: float) -> float:
        cost = self.profile.cost(name)
        acc = self.accelerator
        return max(flops / (acc.peak_flops * cost.flops_efficiency),
                   mem_bytes / (acc.hbm_bandwidth_Bps * cost.memory_efficiency)) + cost.overhead_s
