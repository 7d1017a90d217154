"""The parallel axes and the pick of one per-axis figure, shared by `Layout` and `Coords`."""

from __future__ import annotations

from enum import StrEnum


class Axis(StrEnum):
    """A parallel axis, in Megatron's rank order (fastest-varying first)."""

    TP = "tp"
    CP = "cp"
    DP = "dp"
    PP = "pp"


def along(axis: Axis, tp: int, cp: int, dp: int, pp: int) -> int:
    """The one of four per-axis figures (coordinates or degrees) that `axis` names."""
    match axis:
        case Axis.TP:
            return tp
        case Axis.CP:
            return cp
        case Axis.DP:
            return dp
        case Axis.PP:
            return pp
    raise AssertionError(f"not an axis: {axis!r}")
