"""What a plan's metadata says about how it was built, written and read back in one place.

A plan built for every rank has no `fold` entry. A folded plan (one representative rank per
pipeline stage standing for its tensor-parallel peers and data-parallel replicas) carries

    "fold": {"axes": ["tp", "dp"], "layout": {...the Layout's fields...}}

Plans written before `fold` existed (trace version 1) said `"folded": true` and were folded
with their own `layout`; `read_fold` reads that spelling too, checked the same way.

`read_fold` turns the entry back into the `Layout` whose symmetry the replay uses, and
`read_layout` reads the plan's own `layout` entry; both raise `ConfigError` naming what is
wrong (a bad layout field as `trace: meta.fold.layout.<field>: ...`), so a foreign or edited
trace never escapes as a traceback. Given the trace's ranks, `read_fold` also checks that the
fold stands for the plan: its world is the meta's `world` and the ranks are exactly its
representatives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

from traces.errors import ConfigError, check_keys, show
from traces.layout import Layout

FOLD_AXES = ("tp", "dp")
"""The axes a folded plan collapses: peers along them run the same program."""

_LAYOUT_KEYS = tuple(f.name for f in fields(Layout))


def fold_meta(layout: Layout) -> dict[str, Any]:
    """The `fold` entry of a folded plan's metadata."""
    return {"axes": list(FOLD_AXES), "layout": layout.to_dict()}


def read_fold(meta: Mapping[str, Any], source: str = "trace", *,
              ranks: Iterable[int] | None = None) -> Layout | None:
    """The layout a plan was folded with, or None when it holds every rank. With `ranks` (the
    trace's), they must be exactly the fold's representatives."""
    fold = meta.get("fold")
    where = f"{source}: meta.fold.layout"
    if fold is None:
        if meta.get("folded") is not True:
            return None
        fold = {"axes": list(FOLD_AXES), "layout": meta.get("layout")}  # version 1's spelling
        where = f"{source}: meta.layout"
    if not isinstance(fold, dict) or fold.get("axes") != list(FOLD_AXES):
        raise ConfigError(f"{source}: meta.fold must be an object with \"axes\": "
                          f"{list(FOLD_AXES)} and a \"layout\"; got {show(fold)}")
    layout = _layout(fold.get("layout"), where)
    world = meta.get("world")
    if world is not None and (type(world) is not int or world != layout.world):
        raise ConfigError(f"{where}: tp {layout.tp} x cp {layout.cp} x pp {layout.pp} x "
                          f"dp {layout.dp} = {layout.world:,} ranks, but meta.world is "
                          f"{show(world)}")
    if ranks is not None:
        held, expected = sorted(ranks), layout.representatives()
        if held != expected:
            raise ConfigError(f"{where}: folds onto ranks {_ranks(expected)} (one per "
                              f"pipeline stage), but the trace holds ranks {_ranks(held)}")
    return layout


def read_layout(meta: Mapping[str, Any], source: str = "trace") -> Layout | None:
    """The layout a plan was built for, or None for a trace that does not say (an import)."""
    if "layout" not in meta:
        return None
    return _layout(meta["layout"], f"{source}: meta.layout")


def _layout(table: object, where: str) -> Layout:
    """`Layout(**table)`, its errors (named `parallel.<field>`) renamed to `where.<field>`."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be an object of the [parallel] keys")
    check_keys(table, _LAYOUT_KEYS, where)
    try:
        return Layout(**table)
    except ConfigError as err:
        message = str(err)
        for prefix in ("parallel.", "parallel:"):
            if message.startswith(prefix):
                message = where + message[len("parallel"):]
                break
        raise ConfigError(message) from None


def _ranks(ranks: list[int]) -> str:
    """A rank list for an error line: the first few, then how many in all."""
    if len(ranks) <= 6:
        return str(ranks)
    return f"[{', '.join(map(str, ranks[:4]))}, ... ({len(ranks):,} in all)]"
