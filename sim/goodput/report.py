"""The `parasim goodput --report` page: the run's progress with its failures and checkpoints,
the time lost by cause, the wall times over the Monte-Carlo runs with P50/P90, and the
effective fraction against the checkpoint interval.

At scale (hundreds of failures, tens of thousands of checkpoints in one run) the progress
chart shows at most MAX_CHECKPOINT_MARKS checkpoints and MAX_FAILURE_MARKS failures, evenly
sampled, each legend entry saying how many it stands for: the curve stays readable instead of
a solid band. Every cause is labelled on its bar and its axis, however few there are.

    parasim goodput CONFIG.toml --report run.html

One self-contained, deterministic HTML file (plotly.js inlined once, fixed div ids, no
timestamps), built as `parasim search`'s page is: the text summary, then the figures.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import plotly.graph_objects as go

from sim.goodput.interval import effective_fraction
from sim.goodput.montecarlo import Outcome
from sim.goodput.plan import GoodputPlan
from sim.goodput.text import goodput_text
from sim.report.plotly_page import figure_html, log_axis_ticks, plotly_scripts

T = TypeVar("T")

DAY_S = 86_400.0
DIVS = ("goodput-progress", "goodput-lost", "goodput-badput", "goodput-walltimes",
        "goodput-interval")
MAX_CHECKPOINT_MARKS = 60
MAX_FAILURE_MARKS = 150
"""Markers the progress chart draws at most (all causes together)."""
COLOURS = ("#E45756", "#4C78A8", "#F58518", "#54A24B", "#B279A2", "#9D755D", "#72B7B2",
           "#EECA3B")


def progress_figure(p: GoodputPlan, o: Outcome) -> go.Figure:
    """Tokens against wall days for the first run, with its failures and checkpoints."""
    trace = o.trajectory
    per_s = p.tokens_per_s * p.model.useful_s / p.model.work_s  # tokens per compute second
    t = np.array([pt[0] for pt in trace.points]) / DAY_S
    done = np.array([pt[1] for pt in trace.points]) * per_s
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, p.model.useful_s / DAY_S], y=[0, p.target_tokens],
                             mode="lines", name="without failures or checkpoints",
                             line={"dash": "dot", "color": "#999"}))
    fig.add_trace(go.Scatter(x=t, y=done, mode="lines", name="run 1 (seed "
                             f"{p.seed})", line={"color": "#333", "width": 1}))
    if trace.checkpoints:
        kept = _thin(trace.checkpoints, MAX_CHECKPOINT_MARKS)
        ct = np.array(kept) / DAY_S
        every = trace.checkpoint_every * math.ceil(len(trace.checkpoints) / len(kept))
        fig.add_trace(go.Scatter(
            x=ct, y=np.interp(ct, t, done), mode="markers",
            name="checkpoints" + (f" (1 in {every:,} shown)" if every > 1 else ""),
            marker={"symbol": "line-ns-open", "size": 8, "color": "#54A24B"},
            hovertemplate="checkpoint at day %{x:.3f}<extra></extra>"))
    causes = sorted({f[2] for f in trace.failures})
    share = min(1.0, MAX_FAILURE_MARKS / max(1, len(trace.failures)))
    for i, cause in enumerate(causes):
        hits = [f for f in trace.failures if f[2] == cause]
        shown = _thin(hits, max(1, round(len(hits) * share)))
        fig.add_trace(go.Scatter(
            x=[f[0] / DAY_S for f in shown], y=[f[1] * per_s for f in shown], mode="markers",
            name=f"failure: {cause} ({len(hits):,}"
            + (f", {len(shown):,} shown)" if len(shown) < len(hits) else ")"),
            marker={"symbol": "x", "size": 7, "color": COLOURS[i % len(COLOURS)]},
            hovertemplate=f"{cause} at day %{{x:.3f}}<extra></extra>"))
    fig.update_layout(title=f"Progress of one run: {len(trace.failures):,} interruptions",
                      xaxis_title="wall time (days)", yaxis_title="tokens trained",
                      template="plotly_white", height=560)
    return fig


def lost_figure(p: GoodputPlan, o: Outcome) -> go.Figure:
    """GPU-hours lost per run by cause (mean over the runs): work since the durable
    checkpoint plus the restart; checkpoint stalls beside them."""
    rows = sorted(o.lost_s_by_cause.items(), key=lambda kv: kv[1])
    names = ["checkpoint stalls" if k == "checkpoint" else k for k, _ in rows]
    hours = [v * p.world / 3600 for _, v in rows]
    fig = go.Figure(go.Bar(x=hours, y=names, orientation="h", marker={"color": "#4C78A8"},
                           text=[f"{name}: {h:,.0f}" for name, h in zip(names, hours)],
                           textposition="outside", cliponaxis=False,
                           hovertemplate="%{y}: %{x:,.0f} GPU-hours<extra></extra>"))
    fig.update_layout(title=f"Lost GPU-hours by cause (mean of {len(o.wall_times_s)} runs)",
                      xaxis_title="GPU-hours", template="plotly_white",
                      xaxis_range=[0, max([*hours, 1e-9]) * 1.35],
                      yaxis={"tickmode": "array", "tickvals": names, "ticktext": names,
                             "automargin": True},
                      height=max(320, 140 + 40 * len(rows)))
    return fig


def badput_figure(p: GoodputPlan, o: Outcome) -> go.Figure:
    """Hours per run by ml-goodput-measurement's badput category, goodput beside them."""
    rows = [("goodput (productive training)", o.useful_s),
            *((name, s) for name, s in o.badput_s.items() if s > 0)]
    names, hours = [n for n, _ in rows][::-1], [s / 3600 for _, s in rows][::-1]
    fig = go.Figure(go.Bar(x=hours, y=names, orientation="h", marker={"color": "#72B7B2"},
                           text=[f"{h:,.2f} h" for h in hours], textposition="outside",
                           cliponaxis=False,
                           hovertemplate="%{y}: %{x:,.2f} h<extra></extra>"))
    fig.update_layout(title="Wall time per run by ml-goodput-measurement's categories (mean "
                      f"of {len(o.wall_times_s)} runs)", xaxis_title="hours per run",
                      template="plotly_white",
                      yaxis={"automargin": True}, height=max(320, 140 + 40 * len(rows)))
    # log: 0.1 h of restores beside 720 h of training; labelled at powers of ten or 1-2-5,
    # never plotly's minor digits, with room right of the longest bar for its figure
    shown = [h for h in hours if h > 0] or [1.0]
    lo, hi = min(shown) / 2, max(shown) * 4
    fig.update_xaxes(range=[math.log10(lo), math.log10(hi)], **log_axis_ticks(lo, hi))
    return fig


def walltime_figure(p: GoodputPlan, o: Outcome) -> go.Figure:
    """The histogram of wall times over the Monte-Carlo runs, P50 and P90 marked."""
    days = o.wall_times_s / DAY_S
    p50, p90 = np.percentile(days, [50, 90]).tolist()
    fig = go.Figure(go.Histogram(x=days, nbinsx=min(40, max(5, len(days) // 5)),
                                 marker={"color": "#4C78A8"}, name="runs",
                                 hovertemplate="%{x} d: %{y} runs<extra></extra>"))
    for name, value, colour in (("P50", p50, "#54A24B"), ("P90", p90, "#E45756")):
        fig.add_vline(x=value, line={"color": colour, "dash": "dash"},
                      annotation={"text": f"{name} {value:,.2f} d", "font": {"color": colour}},
                      annotation_position="top")
    fig.update_layout(title=f"Wall time to {p.target_tokens:.3g} tokens over "
                      f"{len(days)} runs (seed {p.seed})", xaxis_title="wall time (days)",
                      yaxis_title="runs", template="plotly_white", height=420, bargap=0.05,
                      showlegend=False)
    return fig


def interval_figure(p: GoodputPlan, o: Outcome) -> go.Figure:
    """The analytic effective fraction against the interval, the optimum marked, and the
    Monte-Carlo's estimate (with its 95% interval) at the interval used."""
    m = p.model
    scale = m.useful_s / m.work_s
    grid = np.geomspace(max(p.daly_s / 30, m.drain_s, 1e-3), p.daly_s * 30, 241)

    def fraction(tau: float) -> float:
        return scale * effective_fraction(m.work_s, tau, m.stall_s, p.restart_s, p.mtti_s)

    fig = go.Figure()
    fig.add_trace(go.Scatter(x=grid / 60, y=[fraction(x) for x in grid], mode="lines",
                             name="expected (Daly's model)", line={"color": "#4C78A8"}))
    for name, tau, symbol, where in (
            ("Daly's optimum", max(p.daly_s, m.drain_s), "star", "top center"),
            ("Young", p.young_s, "diamond", "bottom center")):
        fig.add_trace(go.Scatter(x=[tau / 60], y=[fraction(tau)], mode="markers+text",
                                 name=f"{name}: {tau / 60:.3g} min", text=[name],
                                 textposition=where,
                                 marker={"symbol": symbol, "size": 13}))
    low, high = o.fraction_interval()
    fig.add_trace(go.Scatter(
        x=[p.interval_s / 60], y=[o.effective_fraction], mode="markers",
        name=f"Monte-Carlo at {p.interval_s / 60:.3g} min", marker={"size": 9,
                                                                     "color": "#E45756"},
        error_y={"type": "data", "symmetric": False, "array": [high - o.effective_fraction],
                 "arrayminus": [o.effective_fraction - low]}))
    fig.update_layout(title="Effective training fraction against the checkpoint interval",
                      xaxis_title="compute between checkpoints (min)", xaxis_type="log",
                      yaxis_title="effective training fraction", yaxis_tickformat=".1%",
                      template="plotly_white", height=520)
    fig.update_xaxes(**log_axis_ticks(float(grid.min()) / 60, float(grid.max()) / 60))
    return fig


def render_goodput_report(p: GoodputPlan, o: Outcome) -> str:
    """The whole page as a string (deterministic)."""
    figures = (progress_figure(p, o), lost_figure(p, o), badput_figure(p, o),
               walltime_figure(p, o), interval_figure(p, o))
    parts = [figure_html(div, fig) for div, fig in zip(DIVS, figures)]
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>parasim goodput: {html.escape(p.name)}</title></head>\n<body>\n"
            f"<pre>{html.escape(goodput_text(p, o))}</pre>\n" + "\n".join(parts)
            + f"\n{plotly_scripts()}\n</body></html>\n")


def _thin(items: Sequence[T], at_most: int) -> list[T]:
    """At most `at_most` of `items`, evenly spaced, the first and the last kept."""
    if len(items) <= at_most:
        return list(items)
    picks = np.unique(np.linspace(0, len(items) - 1, at_most).round().astype(int))
    return [items[i] for i in picks]
