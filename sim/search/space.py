"""The candidate space of `parasim search`: the `[search]` table, its defaults, and pruning.

    [parallel]
    global_batch = 1536            # fixed keys: at least the global batch
    [search]                       # candidate values of the rest; absent keys take defaults
    tp = [1, 2, 4, 8]
    pp = [4, 8, 16, 32]
    micro_batch = [1, 2]
    recompute = ["selective", "full"]

A candidate is one value per searched key; `dp` is never searched: it is what is left of the
GPUs, world / (tp·cp·pp) (or the value fixed in [parallel]). Candidates are enumerated in a fixed
order (keys as in SEARCH_KEYS, values as listed), so every run sees the same list.

Defaults (`default_values`): tp in powers of two up to a node, for an MoE model ep in the
powers of two that divide its experts and etp 1 (a dense model searches neither), cp 1
and, for sequences of 8K tokens or more, the powers of two up to a node that leave each rank
at least 4K tokens
(`CP_MIN_TOKENS`: context parallelism pays for its K/V exchange only on long sequences, where
Llama 3 and Megatron-LM's long-context recipes use it), pp the divisors of the layer count,
vp 1, 2 and 4, micro-batches 1, 2, 4 and 8, ZeRO 0-3, SP off and on, every recomputation mode,
and the 1F1B and interleaved schedules (GPipe runs what 1F1B runs with more memory in flight;
list it to compare).

Pruning is the layout's own validation, never a copy of its rules: each candidate's [parallel]
table goes through `sim.config.read_layout` (the `Layout` constructor) and
`traces.layout_rules.check_layout` against the model and the cluster; the first rule it breaks is
its reason, counted with its numbers blanked (`reason_of`), so "model.layers: 96 is not
divisible by pp x vp = 32 x 2 = 64 stages" counts as "model.layers: N is not divisible by pp x
vp = N x N = N stages".
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sim.config import PARALLEL_KEYS, read_layout
from traces.errors import ConfigError, show
from traces.fields import MAX_ACCELERATORS, Fields, check_bool, check_choice, check_int
from traces.layout import (
    MAX_BATCH,
    MAX_VIRTUAL_STAGES,
    Layout,
    Recompute,
    Schedule,
)
from traces.layout_rules import check_layout
from traces.model import ModelSpec

SEARCH_KEYS = ("tp", "cp", "pp", "vp", "micro_batch", "zero", "sp", "recompute", "schedule",
               "ep", "etp")
"""The keys a [search] table may list, in the order candidates are enumerated."""
CP_MIN_TOKENS = 4096
"""The fewest tokens per CP rank a default search gives context parallelism (module docstring)."""
MAX_CANDIDATES = 1_000_000
"""The most candidates a search enumerates (GPT-3's default space on 1024 GPUs: ~28,000)."""
MEMORY_REASON = "memory: the peak per GPU exceeds the accelerator's memory"
_NUMBER = re.compile(r"(?<![\w'\"])\d+(?:[.,]\d+)*(?![\w'\"])")
"""A number on its own: not the 1 of '1f1b' or of a name such as fc1."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Space:
    """The fixed [parallel] keys and the candidate values of the searched ones."""

    fixed: Mapping[str, Any]
    """The [parallel] table as written (human units kept: `read_layout` reads them)."""
    values: Mapping[str, tuple[Any, ...]]
    """Candidate values per searched key, in SEARCH_KEYS order."""
    world: int

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.values.values())

    def candidates(self) -> Iterator[dict[str, Any]]:
        """Each candidate's [parallel] table, in the space's fixed order."""
        keys = list(self.values)
        for combo in itertools.product(*self.values.values()):
            table = {**self.fixed, **dict(zip(keys, combo))}
            if "dp" not in self.fixed:
                # What is left of the GPUs; a remainder makes check_layout reject the world.
                split = table.get("tp", 1) * table.get("cp", 1) * table.get("pp", 1)
                table["dp"] = max(1, self.world // split)
            yield table


def read_space(search: object, parallel: object, *, model: ModelSpec, world: int,
               devices_per_server: int) -> Space:
    """Check the [search] table (a bad one is one ConfigError line naming the field and the
    rule) and fill in the defaults for keys neither searched nor fixed."""
    table = Fields.of(search if search is not None else {}, "search")
    fixed = Fields.of(parallel, "parallel")
    fixed.known(PARALLEL_KEYS)
    if "global_batch" not in fixed:
        raise ConfigError("parallel.global_batch: missing; a search fixes the global batch "
                          "(every candidate trains on the same tokens per step)")
    for key in table.table:
        if key == "dp":
            raise ConfigError("search.dp: dp is not searched; it is what is left of the GPUs, "
                              "world / (tp x cp x pp)")
        if key not in SEARCH_KEYS:
            raise ConfigError(f"search.{show(key)[1:-1]}: unknown key "
                              f"(known: {', '.join(SEARCH_KEYS)})")
        if key in fixed:
            raise ConfigError(f"search.{key}: also fixed in [parallel]; a key is either fixed "
                              "or searched")
    defaults = default_values(model, devices_per_server)
    values: dict[str, tuple[Any, ...]] = {}
    for key in SEARCH_KEYS:
        if key in table:
            values[key] = _candidates(table.table[key], key)
        elif key not in fixed and key in defaults:
            values[key] = defaults[key]
    space = Space(fixed=dict(fixed.table), values=values, world=world)
    if space.size > MAX_CANDIDATES:
        raise ConfigError(f"search: {space.size:,} candidates, more than the "
                          f"{MAX_CANDIDATES:,} a search enumerates; list fewer values")
    return space


def default_values(model: ModelSpec, devices_per_server: int) -> dict[str, tuple[Any, ...]]:
    """Candidate values of the keys a [search] table leaves out (module docstring)."""
    node = [2**k for k in range(devices_per_server.bit_length()) if 2**k <= devices_per_server]
    cps = [cp for cp in node if cp > 1 and model.seq_len // cp >= CP_MIN_TOKENS]
    return {
        "tp": tuple(node),
        "cp": (1, *cps),
        "pp": tuple(d for d in range(1, model.layers + 1) if model.layers % d == 0),
        "vp": (1, 2, 4),
        "micro_batch": (1, 2, 4, 8),
        "zero": (0, 1, 2, 3),
        "sp": (False, True),
        "recompute": tuple(str(r) for r in Recompute if r is not Recompute.SELECTIVE_OP),
        "schedule": (str(Schedule.ONE_F_ONE_B), str(Schedule.INTERLEAVED)),
        # An MoE model's expert parallelism: powers of two dividing the experts (the layout's
        # rules prune those that do not divide tp·cp·dp); ETP 1 (Megatron-Core's default).
        **({"ep": tuple(2**k for k in range(model.experts.bit_length())
                        if model.experts % 2**k == 0), "etp": (1,)} if model.experts else {}),
    }


def _candidates(value: object, key: str) -> tuple[Any, ...]:
    """One key's candidate list, each value of the type the key takes."""
    name = f"search.{key}"
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{name}: {show(value)} must be a non-empty list of candidate "
                          "values")
    out: list[int | bool | str] = []
    for i, item in enumerate(value):
        where = f"{name}[{i}]"
        if key in ("tp", "cp", "pp", "ep", "etp"):
            out.append(check_int(item, where, minimum=1, maximum=MAX_ACCELERATORS))
        elif key == "vp":
            out.append(check_int(item, where, minimum=1, maximum=MAX_VIRTUAL_STAGES))
        elif key == "micro_batch":
            out.append(check_int(item, where, minimum=1, maximum=MAX_BATCH))
        elif key == "zero":
            out.append(check_int(item, where, minimum=0, maximum=3))
        elif key == "sp":
            out.append(check_bool(item, where))
        else:
            choices = [str(e) for e in (Recompute if key == "recompute" else Schedule)]
            out.append(check_choice(item, where, choices))
    seen = set()
    for item in out:
        if (type(item), item) in seen:
            raise ConfigError(f"{name}: {show(item)} is listed twice")
        seen.add((type(item), item))
    return tuple(out)


def validate(table: Mapping[str, Any], model: ModelSpec, *, world: int,
             devices_per_server: int) -> Layout:
    """The candidate's layout, valid for this model and cluster, or ConfigError: the layout's
    own rules (`read_layout`, then `check_layout`)."""
    layout = read_layout(table)
    check_layout(model, layout, world=world, devices_per_server=devices_per_server)
    return layout


def reason_of(error: ConfigError) -> str:
    """A pruning reason: the rule an error names, its numbers blanked, so candidates that
    break one rule count together."""
    return _NUMBER.sub("N", str(error))


def layout_key(layout: Layout) -> tuple[Any, ...]:
    """A total, deterministic order of layouts (ties of predicted time break on it)."""
    return tuple(layout.to_dict().values())


def describe(layout: Layout) -> str:
    """One short line: 'tp8 pp16 dp8 mb1 z0 full 1f1b' (cp, vp, sp and the overlaps, as
    'tp-overlap' and 'param-overlap', only where they apply)."""
    parts = [f"tp{layout.tp}", *([f"cp{layout.cp}"] if layout.cp > 1 else []),
             f"pp{layout.pp}", f"dp{layout.dp}"]
    if layout.cp > 1:
        parts.append(str(layout.cp_comm))
    if layout.vp > 1:
        parts.append(f"vp{layout.vp}")
    if layout.ep > 1 or layout.etp > 1:
        parts += [f"ep{layout.ep}", *([f"etp{layout.etp}"] if layout.etp > 1 else [])]
    parts += [f"mb{layout.micro_batch}", f"z{layout.zero}"]
    if layout.sp:
        parts.append("sp")
    parts += [str(layout.recompute), str(layout.schedule)]
    parts += [name for name, on in (("tp-overlap", layout.tp_comm_overlap and layout.sp),
                                    ("param-overlap", layout.overlap_param_gather)) if on]
    return " ".join(parts)
