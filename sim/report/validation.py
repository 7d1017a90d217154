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
from plotly.subplots import make_subplots

from sim.report.plotly_page import figure_html, log_axis_ticks, plotly_scripts
from sim.validation import Validation, summary_text
from traces.ops import Op, OpKind, Trace

MAX_BARS = 40_000
"""Ops drawn per timeline; beyond this the lanes show the first ones (a validation runs on a
few ranks, so this is a guard, not a view of a large job)."""
FAMILY_COLOUR = {"compute": "#4C78A8", "tp": "#E45756", "p2p": "#2E8B85", "dp": "#C9A227",
                 "other": "#7F7F7F"}


COLOURS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6",
           "#9D755D", "#EECA3B", "#1F3A93", "#8C564B", "#17BECF")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star")
"""The scatter's op classes take a (colour, symbol) pair each: 72 distinct, where the 10
colours of plotly's default cycle repeated over a validation's ~37 classes."""


def render_validation(v: Validation) -> str:
    parts = [figure_html("parasim-validate-timelines", timelines(v)),
             figure_html("parasim-validate-scatter", scatter(v)),
             f"<div id=\"parasim-validate-errors\">{error_table(v)}</div>",
             figure_html("parasim-validate-memory", memory(v)), plotly_scripts()]
    body = "\n".join(parts)
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>parasim validate: {html.escape(v.exp.name)}</title><style>{_STYLE}"
            "</style></head>\n<body>\n"
            f"<pre>{html.escape(summary_text(v))}</pre>\n{body}\n</body></html>\n")


def _family(op: Op) -> str:
    if op.kind is OpKind.COMPUTE:
        return "compute"
    if op.kind.is_p2p:
        return "p2p"
    if op.inline:
        return "tp"
    return "dp" if op.kind.is_collective else "other"


def transfer_starts(trace: Trace) -> dict[tuple[int, int], float]:
    """(rank, index) of each receive with its send -> when the transfer can begin: both
    posted (as `traces.compare` times a transfer). A measured receive runs from its posting,
    waiting for the sender; the simulated one from the data's first byte; drawn from here,
    both show the transfer."""
    sends: dict[tuple[int, int, str], list[Op]] = defaultdict(list)
    recvs: dict[tuple[int, int, str], list[tuple[int, Op]]] = defaultdict(list)
    for rank in trace.ranks:
        for i, op in enumerate(trace.ops[rank]):
            if op.peer is None or op.start is None:
                continue
            if op.kind is OpKind.SEND:
                sends[(rank, op.peer, op.tag)].append(op)
            elif op.kind is OpKind.RECV:
                recvs[(op.peer, rank, op.tag)].append((i, op))
    out = {}
    for (src, dst, tag), posted in recvs.items():
        for send, (i, recv) in zip(sends.get((src, dst, tag), []), posted):
            if send.start is not None and recv.start is not None:
                out[(dst, i)] = max(send.start, recv.start)
    return out


def _bars(trace: Trace) -> dict[str, tuple[list[float], list[float], list[str], list[str]]]:
    """Per op family: starts, durations, lanes and hover texts; a receive from when its
    transfer can begin (`transfer_starts`)."""
    origin = min(op.start for ops in trace.ops.values() for op in ops if op.start is not None)
    begins = transfer_starts(trace)
    out: dict[str, tuple[list[float], list[float], list[str], list[str]]] = defaultdict(
        lambda: ([], [], [], []))
    drawn = 0
    for rank in trace.ranks:
        for i, op in enumerate(trace.ops[rank]):
            if op.start is None or op.end is None or drawn >= MAX_BARS:
                continue
            starts, widths, lanes, texts = out[_family(op)]
            begin = min(begins.get((rank, i), op.start), op.end)
            starts.append((begin - origin) * 1e3)
            widths.append((op.end - begin) * 1e3)
            lanes.append(f"rank {rank} {op.stream}")
            what = op.name if op.kind is OpKind.COMPUTE else f"{op.kind} {op.name}".strip()
            waited = (f"; posted {(begin - op.start) * 1e6:.1f} us before the send"
                      if begin > op.start else "")
            texts.append(f"rank {rank} op {i}: {what} {op.phase or ''}<br>"
                         f"{(op.end - begin) * 1e6:.1f} us{waited}")
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
    for i, (name, pts) in enumerate(sorted(by_class.items())):
        colour, symbol = class_marker(i)
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers",
                                 name=name, marker={"size": 7, "opacity": 0.75,
                                                    "color": colour, "symbol": symbol}))
    if values:
        lo, hi = min(values) / 1.5, max(values) * 1.5
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x",
                                 line={"dash": "dash", "color": "#333"}))
    fig.update_layout(xaxis_type="log", yaxis_type="log", template="plotly_white", height=650,
                      xaxis_title="measured (us)", yaxis_title="predicted (us)",
                      title="predicted against measured time per op, by op class")
    if values:  # 1-2-5 or powers of ten, never plotly's minor digits beside a major label
        fig.update_xaxes(**log_axis_ticks(lo, hi))
        fig.update_yaxes(**log_axis_ticks(lo, hi))
    return fig


def class_marker(i: int) -> tuple[str, str]:
    """The i-th op class's (colour, symbol): every colour in circles, then in squares, ...;
    distinct for len(COLOURS) * len(SYMBOLS) classes, cycling beyond."""
    return COLOURS[i % len(COLOURS)], SYMBOLS[(i // len(COLOURS)) % len(SYMBOLS)]


def error_table(v: Validation) -> str:
    """The per-class errors and the step, as an HTML table (every row shown: a plotly table
    of fixed height cut the classes off)."""
    classes = sorted(v.comparison.classes, key=lambda k: -k.measured_s)
    rows = [("step", "", v.step_time_measured_s, v.step_time_predicted_s, abs(v.step_error),
             v.step_error)]
    rows += [(k.op_class, str(k.count), k.measured_s, k.predicted_s, k.mape, k.bias)
             for k in classes]
    head = "".join(f"<th>{h}</th>" for h in ("op class", "ops", "measured (ms)",
                                            "predicted (ms)", "MAPE", "bias"))
    body = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{count}</td><td>{measured * 1e3:.3f}</td>"
        f"<td>{predicted * 1e3:.3f}</td><td>{mape:.1%}</td><td>{bias:+.1%}</td></tr>"
        for name, count, measured, predicted, mape, bias in rows)
    return ("<h3>errors: per op class (summed times) and the step</h3>"
            f"<table class=\"grid\"><tr>{head}</tr>{body}</table>")


# pre-wrap: the summary's long lines (the op errors' sentence) wrap instead of running off
_STYLE = ("body{font-family:sans-serif}pre{white-space:pre-wrap}"
          "table.grid{border-collapse:collapse;margin:1em 4em}"
          "table.grid td,table.grid th{border-bottom:1px solid #ddd;padding:2px 12px;"
          "text-align:right}table.grid td:first-child,table.grid th:first-child{"
          "text-align:left}")


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
