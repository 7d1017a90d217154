"""The `--report` page of `parasim search`: step time against peak memory, every candidate.

Each valid candidate is a point at its analytic (peak memory per device, step time): blue where
it fits, grey where it does not; the device's memory is the dashed vertical line (devices are
named as in the step report: chips on a torus, GPUs elsewhere). The simulated top K
are drawn again at their simulated step time, each joined to its analytic point by a thin line
(what the simulation changed), the best is labelled, and the seeds' rule of thumb is a star.
One self-contained, deterministic HTML file (plotly.js inlined, fixed div id, no timestamps).
"""

from __future__ import annotations

import html
import math

import plotly.graph_objects as go

from sim.report.plotly_page import figure_html, log_axis_ticks, plotly_scripts
from sim.search.output import result_text
from sim.search.run import Ranked, SearchResult, Simulated
from sim.search.space import describe

GiB = 2**30
DIV_ID = "parasim-search"
LABEL_DROP = 60
"""Pixels the best's label sits below its point."""


def search_figure(r: SearchResult) -> go.Figure:
    fig = go.Figure()
    fits = [(c.layout, c.estimate) for c in r.feasible]
    for name, points, colour in (("fits (analytic)", fits, "#4C78A8"),
                                 ("does not fit (analytic)", r.infeasible, "#BBBBBB")):
        fig.add_trace(go.Scattergl(
            x=[e.peak_memory_bytes / GiB for _, e in points],
            y=[e.step_time_s for _, e in points], mode="markers", name=name,
            marker={"size": 5, "color": colour, "opacity": 0.6},
            text=[describe(lay) for lay, _ in points],
            hovertemplate="%{text}<br>%{y:.3f} s, %{x:.1f} GiB<extra></extra>"))
    sims = r.simulated
    links_x: list[float | None] = []
    links_y: list[float | None] = []
    for c in sims:
        links_x += [c.estimate.peak_memory_bytes / GiB, _sim(c).peak_memory_bytes / GiB, None]
        links_y += [c.estimate.step_time_s, _sim(c).step_time_s, None]
    fig.add_trace(go.Scatter(x=links_x, y=links_y, mode="lines", hoverinfo="skip",
                             line={"color": "#F58518", "width": 1}, showlegend=False))
    fig.add_trace(go.Scatter(
        x=[_sim(c).peak_memory_bytes / GiB for c in sims],
        y=[_sim(c).step_time_s for c in sims], mode="markers",
        name=f"simulated top {r.top_k}", marker={"size": 9, "color": "#F58518",
                                                 "line": {"width": 1, "color": "black"}},
        text=[f"#{i + 1} {describe(c.layout)} (analytic #{c.analytic_rank})"
              for i, c in enumerate(sims)],
        hovertemplate="%{text}<br>%{y:.3f} s, %{x:.1f} GiB<extra></extra>"))
    if r.rule is not None:
        rule = r.rule
        fig.add_trace(go.Scatter(
            x=[_sim(rule).peak_memory_bytes / GiB], y=[_sim(rule).step_time_s],
            mode="markers", name="rule of thumb (simulated)",
            marker={"size": 14, "symbol": "star", "color": "#E45756"},
            text=[describe(rule.layout)],
            hovertemplate="%{text}<br>%{y:.3f} s, %{x:.1f} GiB<extra></extra>"))
    best = r.best
    xs, ys = _extent(r)
    x_lo, x_hi = math.log10(min(xs)) - 0.05, math.log10(max(xs)) + 0.05
    best_x = math.log10(_sim(best).peak_memory_bytes / GiB)
    # On a log axis an annotation's x and y are exponents. The label points in from the
    # nearer edge (to the left of a point on the left it ran off the page) and down: every
    # other simulated point, the rule of thumb's star among them, is slower, so above it.
    fig.add_annotation(x=best_x, y=math.log10(_sim(best).step_time_s),
                       text=f"best: {describe(best.layout)}", showarrow=True, arrowhead=2,
                       ax=80 if best_x < (x_lo + x_hi) / 2 else -80, ay=LABEL_DROP,
                       bgcolor="white")
    # The line's label placed by hand: add_vline's own label takes x as data, where a log
    # axis wants its exponent, and was drawn at 10^16 GiB, off the chart.
    capacity = r.memory_capacity_bytes / GiB
    fig.add_vline(x=capacity, line={"dash": "dash", "color": "#333"})
    fig.add_annotation(x=math.log10(capacity), xref="x", y=1, yref="y domain",
                       yanchor="bottom", showarrow=False,
                       text=f"{r.device} memory {capacity:,.1f} GiB")
    # Every candidate in view (a linear axis stopped at 1.5x the memory, cutting the rest
    # off; one reaching the largest squeezed the layouts that fit into a sliver), and room
    # under the lowest point for the best's label.
    y_lo, y_hi = math.log10(min(ys)) - 0.12, math.log10(max(ys)) + 0.04
    fig.update_xaxes(range=[x_lo, x_hi], **log_axis_ticks(10**x_lo, 10**x_hi))
    fig.update_yaxes(range=[y_lo, y_hi], **log_axis_ticks(10**y_lo, 10**y_hi))
    fig.update_layout(
        title=f"{r.name}: step time against peak memory per {r.device}, "
              f"{r.num_candidates:,} "
              f"candidates, top {r.top_k} simulated",
        xaxis_title=f"peak memory per {r.device} (GiB)", yaxis_title="step time (s)",
        yaxis_type="log", template="plotly_white", height=700)
    return fig


def render_search_report(r: SearchResult) -> str:
    """The whole page: the text summary (without timings: the same search gives the same
    page), then the figure."""
    summary = html.escape(result_text(r, timings=False))
    figure = figure_html(DIV_ID, search_figure(r))
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>parasim search: {html.escape(r.name)}</title></head>\n<body>\n"
            f"<pre>{summary}</pre>\n{figure}\n{plotly_scripts()}\n</body></html>\n")


def _extent(r: SearchResult) -> tuple[list[float], list[float]]:
    """Every drawn point's (GiB, seconds): candidates, simulated, rule of thumb."""
    pairs = [(e.peak_memory_bytes, e.step_time_s)
             for e in [c.estimate for c in r.feasible] + [e for _, e in r.infeasible]]
    pairs += [(_sim(c).peak_memory_bytes, _sim(c).step_time_s)
              for c in r.simulated + ([r.rule] if r.rule is not None else [])]
    return [b / GiB for b, _ in pairs], [t for _, t in pairs]


def _sim(c: Ranked) -> Simulated:
    assert c.simulated is not None
    return c.simulated
