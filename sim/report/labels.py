"""Micro-batch labels of the pipeline view: which passes carry their number at a zoom.

At 1024 GPUs a step holds thousands of passes and, at the default zoom (the whole step), a
pass is a few pixels wide (GPT-3 175B: 192 micro-batches, a forward about 2 px, a backward 5 px
in a 1,400 px plot), far too narrow for its number. Labelling only the passes that hold their
number would show none until the user zooms. The rule, the same here and in the page's script
(`report.js`, `labels`), for a visible range [a, b] at `px_per_s` pixels per second:

1. a pass whose visible part holds its number (`LABEL_PAD_PX + LABEL_DIGIT_PX` per digit) is
   labelled inside its bar (white on a forward's blue, dark on a backward's orange);
2. where passes are narrower, every n-th micro-batch is labelled (in dark text, centred on its
   bar and running over its neighbours), n the smallest of 1, 2, 5, 10, 20, 50, ... for which
   n micro-batches span two labels: `n * gap_s * px_per_s >= 2 * (widest + LABEL_GAP_PX)`,
   `gap_s` the median time between the starts of one row's consecutive passes of one kind
   (forward labels and backward labels interleave within a row, so two to a span);
3. within a row, a label of rule 2 that would overlap a kept label is dropped (rule 1's never
   are: they lie inside disjoint bars).

So at the default zoom GPT-3 shows micro-batches 0, 10, 20, ... on every stage (the staircase
of one micro-batch reads across the rows), zooming in halves n again and again, and from about
a second across every pass holds its own number.

    rows = bars_of(passes, stages)   # sim.report.pipeline: per row (start, end, mb, kind)
    plan = label_plan(rows, 0.0, step_s, NOMINAL_PLOT_PX / step_s, label_gap_s(rows))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LABEL_PAD_PX = 4
LABEL_DIGIT_PX = 6
"""About 6 px per digit of the 10 px text, and a little room."""
LABEL_GAP_PX = 2
"""Least space between two labels of a row."""
NOMINAL_PLOT_PX = 1200
"""Plot width assumed for the labels the figure carries before the page measures its own."""

Bar = tuple[float, float, str, str]
"""(start s, end s, micro-batch number as text ("" for the optimizer step), kind F | B | O)."""


@dataclass(frozen=True, slots=True)
class Label:
    row: int
    x: float
    """Centre of the visible part of the pass (seconds)."""
    text: str
    inside: bool
    """True when the number fits inside its bar (rule 1)."""
    kind: str

    @property
    def light(self) -> bool:
        """White text (inside a forward's blue bar); dark everywhere else."""
        return self.inside and self.kind == "F"


def label_width_px(text: str) -> int:
    return LABEL_PAD_PX + LABEL_DIGIT_PX * len(text)


def label_gap_s(rows: Sequence[Sequence[Bar]]) -> float:
    """Median time between the starts of consecutive passes of one kind in one row; 0 when
    no row has two passes of a kind."""
    gaps: list[np.ndarray] = []
    for bars in rows:
        for k in ("F", "B"):
            starts = np.sort([s for s, _, mb, kind in bars if kind == k and mb != ""])
            if len(starts) > 1:
                gaps.append(np.diff(starts))
    return float(np.median(np.concatenate(gaps))) if gaps else 0.0


def label_stride(gap_s: float, px_per_s: float, widest_px: int) -> int:
    """Rule 2's n: 1, 2, 5, 10, 20, 50, ..."""
    span = gap_s * px_per_s
    n = 1
    while n * span < 2 * (widest_px + LABEL_GAP_PX) and n < 10**9:
        n = n * 5 // 2 if str(n)[0] == "2" else n * 2  # 1 2 5 10 20 50 100 ...
    return n


def label_plan(rows: Sequence[Sequence[Bar]], a: float, b: float, px_per_s: float,
               gap_s: float) -> list[Label]:
    """The labels drawn for the visible range [a, b] (rows: each row's bars, start order)."""
    widest = max((label_width_px(mb) for bars in rows for _, _, mb, _ in bars), default=0)
    n = label_stride(gap_s, px_per_s, widest)
    out: list[Label] = []
    for row, bars in enumerate(rows):
        cands = []  # (x, half width px, text, inside, kind), in start order
        for s, e, mb, kind in bars:
            if mb == "" or e <= a or s >= b:  # nothing of it visible
                continue
            lo, hi = max(s, a), min(e, b)
            width = label_width_px(mb)
            inside = (hi - lo) * px_per_s >= width
            if inside or int(mb) % n == 0:
                cands.append(((lo + hi) / 2, width / 2, mb, inside, kind))
        next_inside = [float("inf")] * (len(cands) + 1)  # left edge (px) of the next rule-1
        for i in range(len(cands) - 1, -1, -1):
            x, half, _, inside, _ = cands[i]
            next_inside[i] = (x - a) * px_per_s - half if inside else next_inside[i + 1]
        right = -float("inf")  # right edge (px) of the last kept label
        for i, (x, half, mb, inside, kind) in enumerate(cands):
            at = (x - a) * px_per_s
            if not inside and (at - half < right + LABEL_GAP_PX
                               or at + half + LABEL_GAP_PX > next_inside[i + 1]):
                continue
            out.append(Label(row, x, mb, inside, kind))
            right = at + half
    return out
