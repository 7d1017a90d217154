"""Rows of intervals drawn as busy fractions per bin: the data the page's script bins.

A binned figure is heatmap traces whose rows each stand for a set of sorted, disjoint intervals
(the ops of a lane, the forward passes of a pipeline rank, its idle gaps). The page's script
bins the visible range into `NUM_BINS` columns and colours each by the fraction of it the
intervals cover, before the first draw and again on every zoom; a bin narrower than an
interval shows it whole. Binning keeps totals exact (sum of fraction * bin width = the
intervals' length), and a heatmap is one image however many intervals it holds.

Intervals travel as whole nanoseconds, coded as the gap before each interval and its length
(float64 holds whole nanoseconds exactly up to 104 days), which compress well.
`binned_z` here is the script's binning in numpy, for tests.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.report.timeline import busy_between

NUM_BINS = 1200
"""Bins across the visible range: about one per pixel of a wide window."""


@dataclass(slots=True)
class BinnedSpec:
    """What the script needs for one figure: per heatmap trace (by index), one interval set
    per row; optionally, per interval, an index into `what` for the hover."""

    div: str
    step_s: float
    traces: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    what: list[list[Any]] = field(default_factory=list)
    """[description, factor * bytes] per distinct op description (hover bus bandwidth)."""
    describe: list[int] = field(default_factory=list)
    """Traces whose bins get hover text from the script."""

    def add(self, trace: int, starts_ns: np.ndarray, ends_ns: np.ndarray,
            what: np.ndarray | None = None) -> None:
        """Append a row to `trace`: sorted, disjoint intervals in whole nanoseconds."""
        ends_before = np.concatenate(([0], ends_ns[:-1])).astype(np.int64)
        row: dict[str, Any] = {"gap": _typed(starts_ns - ends_before, "<f8"),
                               "dur": _typed(ends_ns - starts_ns, "<f8")}
        if what is not None:
            assert len(self.what) <= 2**16, "op descriptions are indexed by uint16"
            row["what"] = _typed(what, "<u2")
        self.traces.setdefault(trace, []).append(row)

    def to_json(self) -> dict[str, Any]:
        return {"div": self.div, "step_s": self.step_s, "bins": NUM_BINS,
                "traces": [{"index": i, "rows": rows} for i, rows in self.traces.items()],
                "what": self.what, "describe": self.describe}


def _typed(values: np.ndarray, dtype: str) -> dict[str, str]:
    data = np.asarray(values).astype(dtype, casting="unsafe")
    return {"dtype": dtype[1:], "bdata": base64.b64encode(data.tobytes()).decode("ascii")}


def decode_row(row: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(starts_ns, ends_ns) of a row as `BinnedSpec.add` coded it."""
    gap = np.frombuffer(base64.b64decode(row["gap"]["bdata"]), "<f8")
    dur = np.frombuffer(base64.b64decode(row["dur"]["bdata"]), "<f8")
    ends = np.cumsum(gap + dur)
    return ends - dur, ends


def binned_z(row: dict[str, Any], lo_s: float, hi_s: float, bins: int = NUM_BINS
             ) -> np.ndarray:
    """The fractions the script draws for one row over [lo, hi]."""
    starts, ends = decode_row(row)
    edges = lo_s * 1e9 + np.arange(bins + 1) * ((hi_s - lo_s) * 1e9 / bins)
    return busy_between(starts, ends, edges[:-1], edges[1:]) / np.diff(edges)
