"""The `parasim validate --report` page: measured against predicted, one self-contained HTML.

    from sim.report.validation import render_validation
    Path("v.html").write_text(render_validation(validation))

Four figures under the text summary:

    timelines   the measured step (top) and the predicted one (bottom) on one time axis, a lane
                per rank and stream, each op a bar coloured by what it does
    scatter     predicted against measured time of every compared op, one series per op class,
                both axes logarithmic, with the y = x line (on it: predicted right)
    errors      the per-class table: ops, measured and predicted totals, MAPE and bias, and the
                step
    memory      peak memory per rank, measured against the memory model

The page carries plotly.js inline (no network needed) and fixed element ids, so the same
validation gives the same bytes.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from sim.validation import Validation, summary_text
from traces.ops import Op, OpKind, Trace

MAX_BARS = 40_000
"""Ops drawn per timeline; beyond this the lanes show the first ones (a validation runs on a
few ranks, so this is a guard, not a view of a large job)."""
FAMILY_COLOUR = {"compute": "#4C78A8", "tp": "#E45756", "p2p": "#2E8B85", "dp": "#C9A227",
                 "other": "#7F7F7F"}


def render_validation(v: Validation) -> str:
    parts = [pio.to_html(timelines(v), include_plotlyjs=True, full_html=False,
                         div_id="parasim-validate-timelines")]
    for name, figure in (("scatter", scatter(v)), ("errors", error_table(v)),
                         ("memory", memory(v))):
        parts.append(pio.to_html(figure, include_plotlyjs=False, full_html=False,
                                 div_id=f"parasim-validate-{name}"))
    body = "\n".join(parts)
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>parasim validate: {html.escape(v.exp.name)}</title></head>\n<body>\n"
            f"<pre>{html.escape(summary_text(v))}</pre>\n{body}\n</body></html>\n")


def _family(op: Op) -> str:
    if op.kind is OpKind.COMPUTE:
        return "compute"
    if op.kind.is_p2p:
        return "p2p"
    if op.inline:
        return "tp"
    return "dp" if op.kind.is_collective else "other"


def _bars(trace: Trace) -> dict[str, tuple[list[float], list[float], list[str], list[str]]]:
    """Per op family: starts, durations, lanes and hover texts."""
    origin = min(op.start for ops in trace.ops.values() for op in ops if op.start is not None)
    out: dict[str, tuple[list[float], list[float], list[str], list[str]]] = defaultdict(
        lambda: ([], [], [], []))
    drawn = 0
    for rank in trace.ranks:
        for i, op in enumerate(trace.ops[rank]):
            if op.start is None or op.end is None or drawn >= MAX_BARS:
                continue
            starts, widths, lanes, texts = out[_family(op)]
            starts.append((op.start - origin) * 1e3)
            widths.append((op.end - op.start) * 1e3)
            lanes.append(f"rank {rank} {op.stream}")
            what = op.name if op.kind is OpKind.COMPUTE else f"{op.kind} {op.name}".strip()
            texts.append(f"rank {rank} op {i}: {what} {op.phase or ''}<br>"
                         f"{(op.end - op.start) * 1e6:.1f} us")
            drawn += 1
    return out


def timelines(v: Validation) -> go.Figure:
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("measured", "predicted"))
    for row, trace in ((1, v.measured), (2, v.predicted.timed_trace())):
        for family, (starts, widths, lanes, texts) in sorted(_bars(trace).items()):
            fig.add_trace(go.Bar(base=starts, x=widths, y=lanes, orientation="h",
                                 name=family, legendgroup=family, showlegend=row == 1,
                                 marker_color=FAMILY_COLOUR[family], hovertext=texts,
                                 hoverinfo="text"), row=row, col=1)
    fig.update_xaxes(title_text="time in the step (ms)", row=2, col=1)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(barmode="overlay", template="plotly_white",
                      height=300 + 40 * len(v.measured.ranks) * 4,
                      title=f"{v.exp.name}: measured and predicted step, one time axis")
    return fig


def scatter(v: Validation) -> go.Figure:
    fig = go.Figure()
    by_class: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in v.comparison.rows:
        by_class[row.op_class].append((row.measured_s * 1e6, row.predicted_s * 1e6))
    values = [x for pts in by_class.values() for p in pts for x in p if x > 0]
    for name, pts in sorted(by_class.items()):
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers",
                                 name=name, marker={"size": 6, "opacity": 0.7}))
    if values:
        lo, hi = min(values) / 1.5, max(values) * 1.5
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x",
                                 line={"dash": "dash", "color": "#333"}))
    fig.update_layout(xaxis_type="log", yaxis_type="log", template="plotly_white", height=650,
                      xaxis_title="measured (us)", yaxis_title="predicted (us)",
                      title="predicted against measured time per op, by op class")
    return fig


def error_table(v: Validation) -> go.Figure:
    classes = sorted(v.comparison.classes, key=lambda k: -k.measured_s)
    cells = [
        ["step", *[k.op_class for k in classes]],
        ["", *[str(k.count) for k in classes]],
        [f"{v.step_time_measured_s * 1e3:.3f}", *[f"{k.measured_s * 1e3:.3f}" for k in classes]],
        [f"{v.step_time_predicted_s * 1e3:.3f}",
         *[f"{k.predicted_s * 1e3:.3f}" for k in classes]],
        [f"{abs(v.step_error):.1%}", *[f"{k.mape:.1%}" for k in classes]],
        [f"{v.step_error:+.1%}", *[f"{k.bias:+.1%}" for k in classes]],
    ]
    fig = go.Figure(go.Table(
        header={"values": ["op class", "ops", "measured (ms)", "predicted (ms)", "MAPE",
                           "bias"], "align": "left"},
        cells={"values": cells, "align": "left"}))
    fig.update_layout(title="errors: per op class (summed times) and the step",
                      height=120 + 22 * (len(classes) + 1), template="plotly_white")
    return fig


def memory(v: Validation) -> go.Figure:
    ranks = sorted(v.peak_memory_measured_bytes)
    mib = 2**20
    fig = go.Figure([
        go.Bar(x=[f"rank {r}" for r in ranks],
               y=[v.peak_memory_measured_bytes[r] / mib for r in ranks], name="measured"),
        go.Bar(x=[f"rank {r}" for r in ranks],
               y=[v.peak_memory_predicted_bytes.get(r, math.nan) / mib for r in ranks],
               name="modelled")])
    fig.update_layout(barmode="group", template="plotly_white", height=400,
                      yaxis_title="peak memory (MiB)", title="peak memory per rank")
    return fig
