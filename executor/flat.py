"""The rank's flat parameter order, gradient buckets over it, and DP shards of the buckets.

The flat order is the units in backward order (`params.units_of_rank`: head, layers last to
first, embed), each unit's parameters in its flat order. Gradient buckets cut it in order at
unit boundaries; each data-parallel rank owns the d-th of dp equal slices of every bucket (the
ZeRO-1/2 shard; ZeRO-3 uses one bucket per unit, so the shard is the d-th slice of each unit).
A rank's shard, bucket after bucket, is one flat tensor: optimizer state and reduced gradients
live in that order.

When no plan gives the sizes, buckets follow the plan builder's own rule
(`traces.plan.data.gradient_buckets`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from executor.params import ParamSpec, unit_specs, units_of_rank
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.plan.data import gradient_buckets
from traces.plan.nodes import RankContext
from traces.purpose import Unit


@dataclass(frozen=True, slots=True)
class Bucket:
    index: int
    start: int
    end: int
    units: tuple[Unit, ...]

    @property
    def numel(self) -> int:
        return self.end - self.start


TP_PARTIAL = frozenset({"mla_down.weight", "q_norm.weight", "kv_norm.weight",
                        "q_layernorm.weight", "q_layernorm.bias", "k_layernorm.weight",
                        "k_layernorm.bias"})
"""Latent attention's replicated tensors: each TP rank back-propagates only its heads' share
into them, so their gradients are summed over TP even without SP (`traces.plan.nodes`)."""


class FlatLayout:
    """Where each unit and parameter of one rank lies in its flat buffers."""

    def __init__(self, model: ModelSpec, layout: Layout, pp_rank: int) -> None:
        self.model, self.layout, self.pp_rank = model, layout, pp_rank
        self.units = units_of_rank(model, layout, pp_rank)
        self.specs: dict[Unit, list[ParamSpec]] = {}
        self.unit_range: dict[Unit, tuple[int, int]] = {}
        self.param_range: dict[tuple[Unit, str], tuple[int, int]] = {}
        offset = 0
        for unit in self.units:
            specs = unit_specs(model, layout, unit, pp_rank)
            self.specs[unit] = specs
            start = offset
            for spec in specs:
                self.param_range[(unit, spec.name)] = (offset, offset + spec.numel)
                offset += spec.numel
            self.unit_range[unit] = (start, offset)
        self.total = offset

    def unit_numel(self, unit: Unit) -> int:
        start, end = self.unit_range[unit]
        return end - start

    def replicated_ranges(self) -> list[tuple[int, int]]:
        """Flat ranges of the parameters every TP rank holds whole (the same on each)."""
        return [self.param_range[(u, s.name)] for u in self.units for s in self.specs[u]
                if s.sp_partial]

    def sp_ranges(self) -> list[tuple[int, int]]:
        """Flat ranges of the parameters every TP rank holds whole whose gradient is partial:
        under SP all of them; without, latent attention's replicated projection and norms and
        qk_norm's weights (`traces.heads`)."""
        return [self.param_range[(u, s.name)] for u in self.units for s in self.specs[u]
                if s.sp_partial and (self.layout.sp or s.name in TP_PARTIAL)]


def _buckets(flat: FlatLayout, groups: list[list[Unit]]) -> list[Bucket]:
    out: list[Bucket] = []
    for units in groups:
        start, end = flat.unit_range[units[0]][0], flat.unit_range[units[-1]][1]
        out.append(Bucket(len(out), start, end, tuple(units)))
    assert [u for b in out for u in b.units] == flat.units, "buckets tile the flat order"
    return out


def rule_buckets(flat: FlatLayout) -> list[Bucket]:
    """Buckets by the plan builder's rule (`traces.plan.data.gradient_buckets`)."""
    layout = flat.layout
    ctx = RankContext(model=flat.model, layout=layout, rank=layout.rank(pp=flat.pp_rank))
    return _buckets(flat, gradient_buckets(ctx))


def unit_buckets(flat: FlatLayout) -> list[Bucket]:
    """One bucket per unit (ZeRO-3 reduces and gathers unit by unit)."""
    return _buckets(flat, [[u] for u in flat.units])


def sized_buckets(flat: FlatLayout, sizes_bytes: Sequence[float], elem_bytes: int
                  ) -> list[Bucket]:
    """Buckets of the given sizes (a plan's `grads` ops, in order), which must cut the flat
    order at unit boundaries; a ConfigError says where they do not."""
    groups: list[list[Unit]] = []
    units = iter(flat.units)
    for index, size in enumerate(sizes_bytes):
        if size % elem_bytes:
            raise ConfigError(f"plan: gradient bucket {index} of {size:g} bytes is not a whole "
                              f"number of {elem_bytes}-byte elements")
        want, got = int(size) // elem_bytes, 0
        current: list[Unit] = []
        while got < want:
            unit = next(units, None)
            if unit is None:
                raise ConfigError(f"plan: gradient buckets hold more than the rank's "
                                  f"{flat.total} parameters")
            current.append(unit)
            got += flat.unit_numel(unit)
        if got != want:
            raise ConfigError(f"plan: gradient bucket {index} ({want} parameters) does not end "
                              f"at a unit boundary (units {_names(current)} hold {got})")
        groups.append(current)
    if next(units, None) is not None:
        raise ConfigError(f"plan: gradient buckets hold fewer than the rank's {flat.total} "
                          "parameters")
    return _buckets(flat, groups)


def _names(units: Sequence[Unit]) -> str:
    return ", ".join(map(str, units))


def check_shardable(buckets: list[Bucket], dp: int) -> None:
    for b in buckets:
        if b.numel % dp:
            raise ConfigError(f"parallel.dp: bucket {b.index} (units {_names(b.units)}) holds "
                              f"{b.numel} parameters, not divisible by dp = {dp}; ZeRO shards "
                              "every bucket in dp equal slices")


class Shards:
    """This DP rank's slice of each bucket, and where it lies in the rank's shard tensor."""

    def __init__(self, buckets: list[Bucket], dp: int, dp_rank: int) -> None:
        check_shardable(buckets, dp)
        self.buckets, self.dp, self.dp_rank = buckets, dp, dp_rank
        self.flat_slice: list[tuple[int, int]] = []   # in the flat order
        self.shard_slice: list[tuple[int, int]] = []  # in the shard tensor
        offset = 0
        for b in buckets:
            n = b.numel // dp
            self.flat_slice.append((b.start + dp_rank * n, b.start + (dp_rank + 1) * n))
            self.shard_slice.append((offset, offset + n))
            offset += n
        self.total = offset

    def owned(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """Pieces of the flat range [start, end) this rank owns: (flat start, shard start,
        length)."""
        pieces = []
        for (fa, fb), (sa, _) in zip(self.flat_slice, self.shard_slice):
            lo, hi = max(start, fa), min(end, fb)
            if lo < hi:
                pieces.append((lo, sa + lo - fa, hi - lo))
        return pieces
