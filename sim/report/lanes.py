"""Lanes of chosen ranks: how busy each stream is over time, never a bar spanning a run.

Each lane (a stream; the compute stream's kernels and its inline collectives apart) is drawn
as a row of bins, each coloured by the fraction of it the lane is busy: the time its ops
actually occupy, whatever the zoom. The page's script re-bins the visible range when the user
zooms (the lanes' exact intervals travel with the page, in whole nanoseconds, as gaps and
durations), so a bin narrower than an op shows it whole and its hover names the op: what it
carries, bytes, algorithm, start, duration and achieved bus bandwidth. A heatmap row is one
image, so the page draws the same few shapes for 8 micro-batches or 8,000.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from sim.engine.replay import StepTimes
from sim.report.binned import BinnedSpec
from sim.report.collectives import CommIndex
from sim.report.timeline import TP_LANE, Lane
from sim.report.words import Words
from traces.chrome import binary_size
from traces.ops import Stream
from traces.purpose import HostCopy

ROW_PX = 22

LANE_COLOUR = {str(Stream.COMPUTE): "#4C78A8", TP_LANE: "#E45756",
               str(Stream.RECV_PREV): "#2E8B85", str(Stream.SEND_NEXT): "#2E8B85",
               str(Stream.RECV_NEXT): "#2E8B85", str(Stream.SEND_PREV): "#2E8B85",
               str(Stream.DP): "#C9A227", str(Stream.ZERO_AG): "#C9A227",
               str(Stream.ZERO_RS): "#C9A227"}
OTHER_COLOUR = "#7F7F7F"


@dataclass(frozen=True, slots=True, kw_only=True)
class LanesView:
    figure: go.Figure
    lanes: list[Lane]
    """The rows, top to bottom (trace i draws row i)."""
    spec: BinnedSpec


def lanes_view(times: StepTimes, rank_lanes: dict[int, list[Lane]], ranks: list[int],
               words: Words, comm: CommIndex, title: str, div: str) -> LanesView:
    """Busy-fraction rows for every lane of `ranks`, rank after rank (`rank_lanes`: the
    plan ranks' lanes)."""
    step = times.step_time_s
    rows: list[Lane] = [lane for rank in ranks for lane in rank_lanes[rank]]
    spec = BinnedSpec(div=div, step_s=step)
    seen: dict[str, int] = {}
    fig = go.Figure()
    labels = [_row_label(words, lane) for lane in rows]
    for i, lane in enumerate(rows):
        colour = LANE_COLOUR.get(lane.name, OTHER_COLOUR)
        fig.add_trace(go.Heatmap(
            y=[i], zmin=0, zmax=1, showscale=False, meta=labels[i], name=labels[i],
            # a faint tint from the first busy nanosecond, full colour when always busy
            colorscale=[[0, "rgba(255,255,255,0)"], [1e-9, _tint(colour)], [1, colour]],
            hovertemplate="<b>%{meta}</b><br>%{text}<extra></extra>"))
        spec.add(i, lane.starts_ns, lane.ends_ns, None if lane.name == Stream.COMPUTE
                 else _what(times, comm, lane, spec, seen))
        spec.describe.append(i)
    bounds = [i - 0.5 for i in range(1, len(rows)) if rows[i].rank != rows[i - 1].rank]
    fig.update_layout(
        title={"text": title}, height=150 + ROW_PX * len(rows),
        xaxis={"title": "time (s)", "range": [0, step] if step > 0 else None,
               "showgrid": False},
        yaxis={"tickmode": "array", "tickvals": list(range(len(rows))), "ticktext": labels,
               "range": [len(rows) - 0.5, -0.5], "zeroline": False, "showgrid": False},
        shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": y, "y1": y,
                 "line": {"color": "#444", "width": 1}} for y in bounds],
        margin={"t": 80, "l": 10, "r": 10}, plot_bgcolor="#F4F4F4")
    return LanesView(figure=fig, lanes=rows, spec=spec)


def _row_label(words: Words, lane: Lane) -> str:
    where = (f"pp {words.layout.coords(lane.rank).pp} r{lane.rank}" if words.layout
             else f"r{lane.rank}")
    return f"{where} · {lane.name}"


def _what(times: StepTimes, comm: CommIndex, lane: Lane, spec: BinnedSpec,
          seen: dict[str, int]) -> np.ndarray:
    """Per op of a communication lane (or a host copy lane), the index of its description in
    `spec.what`."""
    ops = times.plan.ops[lane.rank]
    index = []
    for i in lane.ops:
        op = ops[int(i)]
        if isinstance(op.purpose, HostCopy):  # no collective: the host link's bytes
            text = (f"{op.name} of a layer's activations · {binary_size(op.size_bytes)} · "
                    "host link")
            moved = op.size_bytes
        else:
            info = comm.info(lane.rank, int(i), op)
            text = (f"{info.carries} · {info.kind} · {binary_size(info.size_bytes)} · "
                    f"{info.group_size} ranks · {info.algo}")
            moved = info.factor * info.size_bytes
        if text not in seen:
            seen[text] = len(spec.what)
            spec.what.append([text, moved])
        index.append(seen[text])
    return np.asarray(index)


def _tint(hex_colour: str) -> str:
    """The colour at 30% strength over white (at 12% a lane of sends busy 1% of each bin
    vanished into the grey background)."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    mix = [round(255 - 0.30 * (255 - c)) for c in (r, g, b)]
    return f"rgb({mix[0]},{mix[1]},{mix[2]})"
