"""The pipeline view: one row per pipeline rank, forward and backward of every micro-batch at
the simulated times — the 1F1B (or GPipe, or interleaved) diagram of Megatron-LM's and
PyTorch's docs, with the bubble drawn.

Each row is five layers of bins (`sim.report.binned`, binned by the page's script, re-binned on
zoom): forward passes, backward passes (recomputation included), the optimizer step,
communication outside the passes (pipeline sends and receives, gradient reduction) and idle
time (no op of the rank runs: the bubble, whose total is the step metric). A bin's colour is
as deep as the share of it the layer covers, so totals are exact at any zoom and the figure
draws the same few images for 8 micro-batches or 8,000. Each pass is also one point of data
(drawn as nothing) holding its exact start, end and duration (float64: duration = end -
start); from these the script writes the hover of an invisible heatmap on top (the pass under
each bin's centre, at any zoom) and the micro-batch numbers: inside the passes wide enough to
hold them, every n-th micro-batch where they are narrower (`sim.report.labels`; the figure
carries those of the whole step at a nominal width, the page redoes them at its own).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from sim.engine.replay import StepTimes
from sim.report.binned import BinnedSpec
from sim.report.labels import NOMINAL_PLOT_PX, Bar, label_gap_s, label_plan
from sim.report.timeline import Pass, RankOps, idle_intervals, pipeline_passes, union
from sim.report.words import Words

LAYERS = {"idle": ("idle (bubble)", "#BDBDBD"),
          "comm": ("communication outside passes", "#E45756"),
          "F": ("forward", "#4C78A8"), "B": ("backward (recompute included)", "#F58518"),
          "O": ("optimizer step", "#54A24B"),
          "W": ("weight gradients (zero-bubble W)", "#B279A2")}
"""Layer -> (legend label, colour); bottom to top."""
ROW_PX = 30
TICK_CHAR_PX, TICK_PAD_PX = 7, 14
"""Room for the row labels (12 px text: about 5.5 px a character in Chromium's sans-serif)."""
LABEL_COLOUR = {True: "white", False: "#1A1A1A"}
"""White inside a forward's blue bar, dark on orange and over neighbours (`Label.light`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineView:
    figure: go.Figure
    spec: BinnedSpec
    passes: dict[int, list[Pass]]
    """Pipeline rank -> its passes, in the order they ran."""
    idle: dict[int, tuple[np.ndarray, np.ndarray]]
    """Pipeline rank -> its idle intervals (seconds)."""
    bubble_fraction: float
    """Idle time drawn, over rows * step time."""


def pipeline_view(times: StepTimes, cols: dict[int, RankOps], stages: dict[int, int],
                  words: Words, title: str, div: str) -> PipelineView:
    """The figure for `stages` (pipeline rank -> the plan rank drawn for it), top to bottom;
    `cols` holds the plan ranks' ops as columns."""
    step = times.step_time_s
    passes = {pp: pipeline_passes(times, rank, cols[rank]) for pp, rank in stages.items()}
    idle = {pp: idle_intervals(cols[rank], step) for pp, rank in stages.items()}
    comm = {pp: _comm_only(step, passes[pp], idle[pp]) for pp in stages}
    bubble = (sum(float(np.sum(e - s)) for s, e in idle.values()) / (len(stages) * step)
              if step > 0 else 0.0)
    spec = BinnedSpec(div=div, step_s=step)
    fig = go.Figure()
    rows = list(range(len(stages)))
    for layer, (label, colour) in LAYERS.items():
        index = len(fig.data)
        fig.add_trace(go.Heatmap(
            y=rows, zmin=0, zmax=1, showscale=False, hoverinfo="skip", name=label,
            colorscale=[[0, _rgba(colour, 0)], [1, _rgba(colour, 1)]]))
        for pp in stages:
            if layer == "idle":
                s, e = idle[pp]
            elif layer == "comm":
                s, e = comm[pp]
            else:
                mine = [p for p in passes[pp] if p.kind == layer]
                # a wait inside a pass (the optimizer's, for the other stages' gradient norm)
                # is drawn as the idle time it is
                s, e = _minus((np.array([p.start for p in mine]),
                               np.array([p.end for p in mine])), idle[pp])
            spec.add(index, _ns(s), _ns(e))
    for kind in ("F", "B", "O", "W"):
        placed = [(row, p) for row, pp in enumerate(stages) for p in passes[pp]
                  if p.kind == kind]
        if placed:
            fig.add_trace(_hover(kind, LAYERS[kind][0], placed))
    # micro-batch numbers (sim.report.labels): those of the whole step at a nominal width;
    # the page's script redoes them at its own width and on every zoom
    bars = bars_of(passes, stages)
    gap = label_gap_s(bars)
    plan = label_plan(bars, 0.0, step, NOMINAL_PLOT_PX / step, gap) if step > 0 else []
    fig.add_trace(go.Scatter(
        x=[p.x for p in plan], y=[p.row for p in plan], text=[p.text for p in plan],
        mode="text", name="micro-batch", showlegend=False, hoverinfo="skip",
        textfont={"color": [LABEL_COLOUR[p.light] for p in plan], "size": 10},
        meta={"labels": True, "gap_s": gap, "colours": [LABEL_COLOUR[False],
                                                        LABEL_COLOUR[True]]}))
    # on top, invisible: the script writes into each bin the pass under its centre
    fig.add_trace(go.Heatmap(y=rows, zmin=0, zmax=1, showscale=False, name="hover",
                             colorscale=[[0, "rgba(0,0,0,0)"], [1, "rgba(0,0,0,0)"]],
                             hovertemplate="%{text}<extra></extra>", meta={"hover": True}))
    ticks = [words.row(rank) for rank in stages.values()]
    fig.update_layout(
        title={"text": title}, height=150 + ROW_PX * len(rows), showlegend=False,
        xaxis={"title": "time (s)", "range": [0, step] if step > 0 else None,
               "showgrid": False},
        yaxis={"tickmode": "array", "tickvals": rows, "ticktext": ticks,
               "range": [len(rows) - 0.5, -0.5], "zeroline": False, "showgrid": False,
               "automargin": False},
        # white lines between the rows (a heatmap's own ygap draws brick by brick: 5x slower)
        shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": r + 0.5,
                 "y1": r + 0.5, "line": {"color": "white", "width": 6}} for r in rows[:-1]],
        # fixed margins, so the page knows the plot's width before drawing (its labels)
        updatemenus=_views(passes, stages, step),
        margin={"t": 60, "l": TICK_PAD_PX + TICK_CHAR_PX * max(map(len, ticks)),
                "r": 10}, hovermode="closest", plot_bgcolor="white")
    return PipelineView(figure=fig, spec=spec, passes=passes, idle=idle,
                        bubble_fraction=bubble)


def legend_html() -> str:
    """The layers' colours, as a line of HTML above the figure."""
    return " ".join(f"<span class='key' style='background:{colour}'></span>{label}"
                    for label, colour in LAYERS.values())


def _views(passes: dict[int, list[Pass]], stages: dict[int, int],
           step: float) -> list[dict[str, object]]:
    """Buttons over the figure that zoom every time axis to the warm-up (from the start to the
    first stage's first backward: the staircase), the cool-down (from its last forward to the
    end) or the whole step; none without a pipeline. The page's zoom handler re-bins."""
    first = passes[next(iter(stages))]
    backward = [p.start for p in first if p.kind == "B"]
    forward = [p.end for p in first if p.kind == "F"]
    if len(stages) < 2 or not backward or not forward or step <= 0:
        return []
    warm, cool = min(backward), max(forward)
    ranges = [("warm-up", [0.0, min(step, 1.05 * warm)]),
              ("cool-down", [max(0.0, cool - 0.05 * (step - cool)), step]),
              ("whole step", [0.0, step])]
    return [{"type": "buttons", "direction": "right", "showactive": False,
             "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom", "pad": {"r": 0},
             "buttons": [{"label": label, "method": "relayout", "args": [{"xaxis.range": r}]}
                         for label, r in ranges]}]


def bars_of(passes: dict[int, list[Pass]], stages: dict[int, int]) -> list[list[Bar]]:
    """Per row (top to bottom), its passes as label bars, in start order."""
    return [sorted((p.start, p.end, "" if p.microbatch is None else str(p.microbatch), p.kind)
                   for p in passes[pp]) for pp in stages]


def _hover(kind: str, label: str, placed: list[tuple[int, Pass]]) -> go.Scatter:
    """The passes of one kind as data: one point per pass at its centre, drawn as nothing,
    holding start, end and duration (float64, exact), the micro-batch and the details the
    page's script shows in the hover and as labels."""
    ps = [p for _, p in placed]
    start = np.array([p.start for p in ps])
    end = np.array([p.end for p in ps])
    title = "optimizer step" if kind == "O" else f"{label.split(' ')[0]} of micro-batch"
    return go.Scatter(
        x=(start + end) / 2, y=np.array([row for row, _ in placed], dtype=np.int16),
        mode="none", hoverinfo="skip", name=title, showlegend=False, meta={"passes": kind},
        customdata=np.column_stack([start, end, end - start]),
        text=["" if p.microbatch is None else str(p.microbatch) for p in ps],
        hovertext=[_details(p) for p in ps])


def _details(p: Pass) -> str:
    stage = "" if p.stage is None else f"stage {p.stage}: "
    text = f"{stage}kernels {_ms(p.compute_s)}, inline collectives {_ms(p.tp_s)}"
    return text + (f"; recompute {_ms(p.recompute_s)} of the kernels" if p.recompute_s else "")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


def _ns(seconds: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(seconds, float) * 1e9).astype(np.int64)


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _minus(intervals: tuple[np.ndarray, np.ndarray],
           holes: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint `intervals` with the sorted, disjoint `holes` cut out."""
    starts: list[float] = []
    ends: list[float] = []
    for s, e in zip(*intervals):
        cur = float(s)
        for hs, he in zip(*holes):
            if he <= cur or hs >= e:
                continue
            if hs > cur:
                starts.append(cur)
                ends.append(float(hs))
            cur = max(cur, float(he))
        if cur < e:
            starts.append(cur)
            ends.append(float(e))
    return np.array(starts, dtype=float), np.array(ends, dtype=float)


def _comm_only(step: float, passes: list[Pass],
               idle: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Busy time of the rank outside its passes: [0, step] minus passes minus idle."""
    covered_s, covered_e = union(np.concatenate(([p.start for p in passes], idle[0])),
                                 np.concatenate(([p.end for p in passes], idle[1])))
    gap_s = np.concatenate(([0.0], covered_e))
    gap_e = np.concatenate((covered_s, [step]))
    keep = gap_e > gap_s
    return gap_s[keep], gap_e[keep]
