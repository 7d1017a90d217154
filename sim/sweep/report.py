"""The `parasim sweep --report` page: the table, step time and tokens/s/GPU against the value,
and MFU and peak memory (with the GPU's capacity) against it. Self-contained and deterministic,
as the goodput page is (fixed div ids, plotly.js inline once).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.report.memory_scale import MemoryScale
from sim.report.plotly_page import figure_html, plotly_scripts
from sim.simulate import size_text
from sim.sweep.points import Point, sweep_rows, sweep_text

DIVS = ("parasim-sweep-time", "parasim-sweep-memory")


def _xs(points: Sequence[Point]) -> list[str]:
    """The values as the x axis shows them: categories, evenly spaced in the order given (a
    sweep of 1, 2, 4, 8 reads as four steps, and a schedule's name sits beside a number)."""
    return [row[0] for row in sweep_rows(points)]


def _scale(points: Sequence[Point]) -> MemoryScale:
    """The memory unit of the chart: that of the largest peak (the bars), as the table writes
    it, so a 6 MiB peak reads as 6 on a MiB axis and not as 0.006 on a GiB one."""
    return MemoryScale.of(max(p.summary.peak_memory_bytes for p in points),
                          max(p.summary.memory_capacity_bytes for p in points))


def _capacity_line(xs: list[str], points: Sequence[Point], scale: MemoryScale) -> go.Scatter:
    """The GPU's memory as a dashed line; where it would dwarf the bars (`MemoryScale`),
    hidden at first (a click on its legend entry shows it), its size in its name."""
    name = (f"GPU memory ({scale.unit})" if scale.capacity_drawn
            else f"GPU memory {size_text(scale.capacity_bytes)} (off the scale: click to show)")
    return go.Scatter(x=xs, y=[p.summary.memory_capacity_bytes / scale.size for p in points],
                      name=name, mode="lines", line={"color": "#e45756", "dash": "dash"},
                      visible=True if scale.capacity_drawn else "legendonly")


def time_figure(key: str, points: Sequence[Point]) -> go.Figure:
    """Step time (left axis) and tokens/s per GPU (right axis) against the value."""
    xs = _xs(points)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=xs, y=[p.summary.step_time_s for p in points], name="step time",
                             mode="lines+markers"), secondary_y=False)
    fig.add_trace(go.Scatter(x=xs, y=[p.tokens_per_s_per_gpu for p in points],
                             name="tokens/s per GPU", mode="lines+markers",
                             line={"dash": "dot"}), secondary_y=True)
    fig.update_layout(title=f"Step time and throughput against {key}", template="plotly_white",
                      height=460, xaxis_title=key, xaxis_type="category")
    fig.update_yaxes(title_text="step time (s)", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="tokens/s per GPU", rangemode="tozero", secondary_y=True,
                     showgrid=False, tickmode="auto")
    return fig


def memory_figure(key: str, points: Sequence[Point]) -> go.Figure:
    """MFU (left axis) and the fullest rank's peak memory against the GPU's (right axis)."""
    xs = _xs(points)
    scale = _scale(points)
    unit, size = scale.unit, scale.size
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=xs, y=[p.summary.peak_memory_bytes / size for p in points],
                         name=f"peak memory ({unit})", opacity=0.5,
                         marker_color=["#4c78a8" if p.summary.fits else "#e45756"
                                       for p in points]), secondary_y=True)
    fig.add_trace(_capacity_line(xs, points, scale), secondary_y=True)
    fig.add_trace(go.Scatter(x=xs, y=[p.summary.mfu for p in points], name="MFU",
                             mode="lines+markers", line={"color": "#54a24b"}),
                  secondary_y=False)
    fig.update_layout(title=f"MFU and peak memory against {key} (red bars do not fit)",
                      template="plotly_white", height=460, xaxis_title=key, xaxis_type="category")
    fig.update_yaxes(title_text="MFU", tickformat=".0%", rangemode="tozero",
                     secondary_y=False)
    fig.update_yaxes(title_text=f"peak memory ({unit})", rangemode="tozero", secondary_y=True,
                     showgrid=False, tickmode="auto")
    return fig


def render_sweep_report(key: str, points: Sequence[Point]) -> str:
    """The whole page as a string (deterministic)."""
    figures = (time_figure(key, points), memory_figure(key, points))
    parts = [figure_html(div, fig) for div, fig in zip(DIVS, figures)]
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>parasim sweep: {html.escape(key)}</title></head>\n<body>\n"
            f"<pre>{html.escape(sweep_text(key, points))}</pre>\n" + "\n".join(parts)
            + f"\n{plotly_scripts()}\n</body></html>\n")
