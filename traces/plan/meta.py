"""What a plan's metadata says about how it was built, written and read back in one place.

A plan built for every rank has no `fold` entry. A folded plan (one representative rank per
pipeline stage standing for its tensor-parallel peers and data-parallel replicas) carries

    "fold": {"axes": ["tp", "dp"], "layout": {...the Layout's fields...}}

`read_fold` turns that back into the `Layout` whose symmetry the replay uses, and `read_layout`
reads the plan's own `layout` entry; both raise `ConfigError` naming what is wrong, so a
foreign or edited trace never escapes as a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traces.errors import ConfigError
from traces.layout import Layout

FOLD_AXES = ("tp", "dp")
"""The axes a folded plan collapses: peers along them run the same program."""


def fold_meta(layout: Layout) -> dict[str, Any]:
    """The `fold` entry of a folded plan's metadata."""
    return {"axes": list(FOLD_AXES), "layout": layout.to_dict()}


def read_fold(meta: Mapping[str, Any], source: str = "trace") -> Layout | None:
    """The layout a plan was folded with, or None when it holds every rank."""
    fold = meta.get("fold")
    if fold is None:
        return None
    if not isinstance(fold, dict) or fold.get("axes") != list(FOLD_AXES):
        raise ConfigError(f"{source}: meta.fold must be an object with \"axes\": "
                          f"{list(FOLD_AXES)} and a \"layout\"; got {str(fold)[:60]}")
    return _layout(fold.get("layout"), f"{source}: meta.fold.layout")


def read_layout(meta: Mapping[str, Any], source: str = "trace") -> Layout | None:
    """The layout a plan was built for, or None for a trace that does not say (an import)."""
    if "layout" not in meta:
        return None
    return _layout(meta["layout"], f"{source}: meta.layout")


def _layout(table: object, where: str) -> Layout:
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be an object of the [parallel] keys")
    try:
        return Layout(**table)
    except TypeError as err:  # an unknown or missing key
        raise ConfigError(f"{where}: {err}") from None
