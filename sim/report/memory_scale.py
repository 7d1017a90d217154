"""The unit of a memory chart and whether the device's capacity is drawn on it.

A chart shows memory in the unit the text writes its largest peak in (`sim.simulate.size_text`),
so a 6 MiB peak reads 6 on a MiB axis, not 0.006 on a GiB one. A capacity more than
CAPACITY_SPAN times that peak is named above the chart rather than drawn: drawn, its line sets
the axis and flattens the bars and curves to nothing (the 6 MiB tiny GPT on a 3 GiB CPU rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.simulate import size_text

CAPACITY_SPAN = 20.0
"""A capacity up to this many times the largest peak is drawn as a line beside it (the
bars and curves then fill at least a twentieth of the chart)."""
UNITS = {"GiB": 2.0**30, "MiB": 2.0**20, "KiB": 2.0**10}


@dataclass(frozen=True)
class MemoryScale:
    """A memory chart's unit (bytes per unit) and whether the capacity line is drawn."""

    unit: str
    size: float
    capacity_bytes: float
    capacity_drawn: bool

    @classmethod
    def of(cls, peak_bytes: float, capacity_bytes: float) -> MemoryScale:
        """The scale for peaks up to `peak_bytes` on a device of `capacity_bytes`."""
        unit = size_text(peak_bytes)[-3:]
        return cls(unit=unit, size=UNITS[unit], capacity_bytes=capacity_bytes,
                   capacity_drawn=capacity_bytes <= CAPACITY_SPAN * peak_bytes)

    def capacity_text(self, device: str) -> str:
        """'GPU memory 79.6 GiB', and where it is not drawn, that it is off the scale."""
        text = f"{device} memory {size_text(self.capacity_bytes)}"
        return text if self.capacity_drawn else f"{text}: off the scale, not drawn"
