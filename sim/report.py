"""The HTML report of one simulated step: headline figures, timeline, time and memory breakdowns.

    parasim simulate CONFIG.toml --report step.html       # the CLI calls write_report

    from sim.report import write_report
    summary, times = predict(exp)
    write_report("step.html", exp, summary, times)         # ranks=[0, 64] to choose the rows

One self-contained file: plotly.js is inlined once, so it opens offline. Written atomically (a
temporary file beside the target, then a rename) and deterministically (fixed div ids, no
timestamps): the same inputs give the same bytes.

The timeline has one row per (rank, lane). A lane is a stream, except that the tensor-parallel
collectives Megatron issues inline on the compute stream get a lane of their own
("compute/tp"): interleaved with the layers' compute, they would otherwise cut every pass into
four bars per layer. Coalescing: consecutive ops of one lane with the same category,
micro-batch and phase become one bar from the first start to the last end, so a forward or
backward pass is one bar per lane, not one per layer (under activation recomputation each
layer's recompute and backward alternate, so there it is two bars per layer). A bar's hover
gives how many ops it holds and their busy time, which is less than its span where the lane
waited inside it.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from sim.config import Experiment
from sim.metrics import StepSummary
from sim.replay import StepTimes
from sim.simulate import GiB, headline
from traces.errors import ConfigError
from traces.io import write_text_atomic
from traces.layout import Layout
from traces.ops import Op, OpKind, Phase, Trace
from traces.plan.meta import read_fold, read_layout

MAX_DEFAULT_RANKS = 16
TP_LANE = "compute/tp"
LANE_ORDER = ("compute", TP_LANE, "recv_prev", "send_next", "recv_next", "send_prev", "dp",
              "zero_ag", "zero_rs")
DP_STREAMS = ("dp", "zero_ag", "zero_rs")

# Category key -> (legend label, colour); the order is the legend's.
CATEGORIES: dict[str, tuple[str, str]] = {
    "fwd": ("forward compute", "#4C78A8"),
    "bwd": ("backward compute", "#F58518"),
    "recompute": ("recompute", "#B279A2"),
    "opt": ("optimizer", "#54A24B"),
    "tp": ("tensor-parallel collective", "#E45756"),
    "p2p": ("pipeline send/recv", "#72B7B2"),
    "dp": ("data-parallel / ZeRO collective", "#EECA3B"),
    "other": ("other", "#9D9D9D"),
}
_COMPUTE_PHASES = {Phase.FWD: "fwd", Phase.BWD: "bwd", Phase.RECOMPUTE: "recompute",
                   Phase.OPT: "opt"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    """One timeline bar: a run of consecutive ops of one lane with the same key."""

    rank: int
    lane: str
    category: str
    microbatch: int | None
    phase: str | None
    start: float
    end: float
    num_ops: int
    busy_s: float
    """Sum of the ops' durations (ops of one lane never overlap)."""


# --- timeline: categories, lanes, coalescing -----------------------------------------------------

def category(op: Op) -> str:
    """The colour class of an op (a key of CATEGORIES)."""
    if op.kind is OpKind.COMPUTE:
        return _COMPUTE_PHASES.get(op.phase, "other")  # type: ignore[arg-type]
    if op.kind.is_p2p:
        return "p2p"
    if op.stream == "compute":  # Megatron runs TP collectives inline, on the compute stream
        return "tp"
    return "dp" if op.stream in DP_STREAMS else "other"


def lane(op: Op, cat: str) -> str:
    return TP_LANE if cat == "tp" else op.stream


def coalesce(rank: int, ops: Sequence[Op], starts: Sequence[float],
             ends: Sequence[float]) -> list[Bar]:
    """Merge consecutive ops of each lane sharing (category, micro-batch, phase) into bars,
    ordered by lane (LANE_ORDER, then other lanes by name), then in stream order."""
    classes: dict[tuple[OpKind, str, Phase | None], tuple[str, str]] = {}  # -> (category, lane)
    open_runs: dict[str, list] = {}  # lane -> [key, start, end, num_ops, busy]
    bars: list[Bar] = []
    for op, start, end in zip(ops, starts, ends, strict=True):
        # ~18,000 ops per rank in GPT-3's plan: classify each (kind, stream, phase) once.
        cls = (op.kind, op.stream, op.phase)
        found = classes.get(cls)
        if found is None:
            cat = category(op)
            found = classes[cls] = (cat, lane(op, cat))
        cat, name = found
        key = (cat, op.microbatch, op.phase)
        run = open_runs.get(name)
        if run is not None and run[0] == key:
            run[1], run[2] = min(run[1], start), max(run[2], end)
            run[3] += 1
            run[4] += end - start
            continue
        if run is not None:
            bars.append(_bar(rank, name, run))
        open_runs[name] = [key, start, end, 1, end - start]
    bars.extend(_bar(rank, name, run) for name, run in open_runs.items())
    # Stable: within a lane, bars stay in stream order, which is time order.
    order = {name: _lane_key(name) for name in open_runs}
    bars.sort(key=lambda b: order[b.lane])
    return bars


def _bar(rank: int, lane_name: str, run: list) -> Bar:
    (cat, mb, phase), start, end, num_ops, busy = run
    return Bar(rank=rank, lane=lane_name, category=cat, microbatch=mb,
               phase=None if phase is None else str(phase), start=start, end=end,
               num_ops=num_ops, busy_s=busy)


def _lane_key(name: str) -> tuple[int, str]:
    return (LANE_ORDER.index(name), "") if name in LANE_ORDER else (len(LANE_ORDER), name)


def plan_layout(plan: Trace) -> Layout | None:
    return read_layout(plan.meta)


def default_ranks(plan: Trace) -> list[int]:
    """One rank per pipeline stage: a folded plan's ranks, else each stage's lowest rank
    present; without a layout, the first MAX_DEFAULT_RANKS ranks."""
    if read_fold(plan.meta) is not None:
        return plan.ranks
    layout = plan_layout(plan)
    if layout is None:
        return plan.ranks[:MAX_DEFAULT_RANKS]
    lowest: dict[int, int] = {}
    for rank in plan.ranks:  # ascending, so the first seen per stage is the lowest
        lowest.setdefault(layout.coords(rank)["pp"], rank)
    return [lowest[stage] for stage in sorted(lowest)]


def timeline_bars(times: StepTimes, ranks: Iterable[int]) -> list[Bar]:
    """Coalesced bars of the chosen ranks, rank by rank."""
    bars: list[Bar] = []
    for rank in ranks:
        bars += coalesce(rank, times.plan.ops[rank], times.starts[rank], times.ends[rank])
    return bars


# --- figures -----------------------------------------------------------------------------------

def _rank_label(rank: int, layout: Layout | None) -> str:
    return f"r{rank} pp{layout.coords(rank)['pp']}" if layout else f"r{rank}"


def timeline_figure(bars: list[Bar], layout: Layout | None, step_s: float) -> go.Figure:
    """One horizontal-bar trace per category (one legend entry each), rows top to bottom.

    Sized for ~100,000 bars (GPT-3 on 1024 GPUs): y is a row number labelled by the axis
    ticks, durations and hover numbers go as packed float32 (plotly base64-encodes numpy
    arrays), starts rounded to the nanosecond; nested lists are avoided (plotly validates and
    copies them element by element, seconds for this many bars)."""
    labels = {r: _rank_label(r, layout) for r in dict.fromkeys(b.rank for b in bars)}
    row_of = {key: i for i, key in enumerate(dict.fromkeys((b.rank, b.lane) for b in bars))}
    rows = [f"{labels[rank]} {name}" for rank, name in row_of]
    fig = go.Figure()
    for cat, (label, colour) in CATEGORIES.items():
        mine = [b for b in bars if b.category == cat]
        if not mine:
            continue
        # The phase is the category for compute; only communication needs it spelled out.
        with_phase = cat not in _COMPUTE_PHASES.values()
        fig.add_trace(go.Bar(
            orientation="h", name=label, marker={"color": colour, "line": {"width": 0}},
            base=[round(b.start, 9) for b in mine],
            x=np.array([b.end - b.start for b in mine], dtype=np.float32),
            y=np.array([row_of[b.rank, b.lane] for b in mine], dtype=np.int32),
            width=0.8, text=["" if b.microbatch is None else str(b.microbatch) for b in mine],
            textposition="inside", insidetextanchor="middle", textangle=0,
            customdata=np.array([(b.num_ops, b.busy_s) for b in mine], dtype=np.float32),
            hovertext=[b.phase or "-" for b in mine] if with_phase else None,
            hovertemplate=_hover_template(label, with_phase)))
    fig.update_layout(
        title="Timeline: one row per rank and lane; bar text is the micro-batch",
        barmode="overlay", height=160 + 18 * len(rows),
        uniformtext={"minsize": 8, "mode": "hide"},  # hide labels too small to read
        xaxis={"title": "time (s)", "range": [0, step_s] if step_s > 0 else None},
        yaxis={"tickmode": "array", "tickvals": list(range(len(rows))), "ticktext": rows,
               "range": [len(rows) - 0.5, -0.5], "zeroline": False, "showgrid": False},
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom"}, margin={"t": 100},
        hovermode="closest")
    return fig


def _hover_template(label: str, with_phase: bool) -> str:
    phase = ", phase %{hovertext}" if with_phase else ""
    return (f"<b>{label}</b>{phase}<br>micro-batch %{{text}}<br>"
            "start %{base:.6f} s, span %{x:.4g} s<br>"
            "%{customdata[0]} ops, busy %{customdata[1]:.4g} s<extra></extra>")


def breakdown_figure(summary: StepSummary, layout: Layout | None) -> go.Figure:
    """Stacked compute / exposed communication / idle seconds per rank."""
    x = [_rank_label(r.rank, layout) for r in summary.ranks]
    fig = go.Figure()
    for name, values, colour in (
            ("compute", [r.compute_s for r in summary.ranks], "#4C78A8"),
            ("exposed communication", [r.exposed_comm_s for r in summary.ranks], "#E45756"),
            ("idle (bubble)", [r.idle_s for r in summary.ranks], "#BAB0AC")):
        fig.add_trace(go.Bar(name=name, x=x, y=values, marker_color=colour,
                             hovertemplate="%{x}: %{y:.4g} s<extra>" + name + "</extra>"))
    fig.update_layout(title="Where the step's time goes, per rank", barmode="stack", height=420,
                      yaxis_title="seconds", xaxis={"type": "category"})
    return fig


def memory_figure(summary: StepSummary) -> go.Figure:
    """Stacked GiB per pipeline stage, with the GPU's capacity as a dashed line."""
    x = [f"stage {i}" for i in range(len(summary.memory_by_stage))]
    fig = go.Figure()
    for name, attr, colour in (("parameters", "params_bytes", "#4C78A8"),
                               ("gradients", "grads_bytes", "#F58518"),
                               ("optimizer state", "optimizer_bytes", "#54A24B"),
                               ("activations", "activations_bytes", "#B279A2"),
                               ("working buffers", "working_bytes", "#9D9D9D")):
        values = [getattr(m, attr) / GiB for m in summary.memory_by_stage]
        fig.add_trace(go.Bar(name=name, x=x, y=values, marker_color=colour,
                             hovertemplate="%{x}: %{y:.2f} GiB<extra>" + name + "</extra>"))
    capacity = summary.memory_capacity_bytes / GiB
    fig.add_hline(y=capacity, line={"dash": "dash", "color": "#C00000"},
                  annotation_text=f"GPU memory {capacity:.1f} GiB",
                  annotation_position="top left")
    fig.update_layout(title="Memory per GPU, per pipeline stage", barmode="stack", height=420,
                      yaxis_title="GiB", xaxis={"type": "category"})
    return fig


# --- page --------------------------------------------------------------------------------------

def header_html(exp: Experiment, summary: StepSummary) -> str:
    """Experiment, cluster, layout and the headline figures, escaped."""
    L, s, m = exp.layout, summary, exp.model
    layout = f"TP {L.tp} · PP {L.pp} · DP {L.dp} · VP {L.vp}"
    options = (f"ZeRO-{L.zero}, SP {'on' if L.sp else 'off'}, recompute {L.recompute}, "
               f"schedule {L.schedule}, {L.num_microbatches} micro-batches of {L.micro_batch} "
               f"(global batch {L.global_batch})")
    rows = headline(s)
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                    for k, v in rows)
    lines = [
        f"<h1>parasim: {html.escape(exp.name)}</h1>",
        f"<p>cluster <b>{html.escape(exp.cluster.name)}</b> ({L.world} GPUs, "
        f"{html.escape(exp.cluster.accelerator.name)}), network model "
        f"{html.escape(exp.network)}, collectives {html.escape(exp.algo)}</p>",
        f"<p>model: {m.layers} layers, hidden {m.hidden}, {m.heads} heads, sequence "
        f"{m.seq_len}, vocabulary {m.vocab}, {html.escape(m.dtype)}</p>",
        f"<p>layout: <b>{layout}</b>; {html.escape(options)}</p>",
        f"<table>{table}</table>",
        "<p>collectives run: " + html.escape(", ".join(
            f"{algo} {count}" for algo, count in s.algorithms.items()) or "none") + "</p>",
    ]
    lines += [f"<p class='warn'>warning: {html.escape(w)}</p>" for w in exp.warnings]
    return "\n".join(lines)


_STYLE = ("body{font-family:sans-serif;margin:1.5em;color:#222}"
          "table{border-collapse:collapse}th,td{padding:2px 12px;text-align:left}"
          "th{font-weight:normal;color:#555}.warn{color:#a60}")


def render_report(exp: Experiment, summary: StepSummary, times: StepTimes,
                  ranks: list[int] | None = None) -> str:
    """The whole HTML page as a string (deterministic)."""
    plan = times.plan
    chosen = default_ranks(plan) if ranks is None else list(dict.fromkeys(ranks))
    missing = [r for r in chosen if r not in plan.ops]
    if missing:
        raise ConfigError(f"report: rank {missing[0]} is not in the simulated plan "
                          f"(ranks present: {plan.ranks[:8]}{' ...' if len(plan.ops) > 8 else ''})")
    layout = plan_layout(plan)
    figures = [("parasim-timeline", timeline_figure(timeline_bars(times, chosen), layout,
                                                    times.step_time_s)),
               ("parasim-breakdown", breakdown_figure(summary, layout)),
               ("parasim-memory", memory_figure(summary))]
    # Fixed div ids (plotly draws random ones) keep the file byte-identical from run to run;
    # only the first figure carries plotly.js, inlined so the page works offline.
    parts = [pio.to_html(fig, include_plotlyjs=i == 0, full_html=False, div_id=div_id)
             for i, (div_id, fig) in enumerate(figures)]
    return ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
            f"<title>parasim: {html.escape(exp.name)}</title><style>{_STYLE}</style></head>\n"
            f"<body>\n{header_html(exp, summary)}\n" + "\n".join(parts) + "\n</body></html>\n")


def write_report(path: str | Path, exp: Experiment, summary: StepSummary, times: StepTimes,
                 ranks: list[int] | None = None) -> None:
    """Render the report and write it to `path` atomically; `ranks` picks the timeline's rows
    (default: one rank per pipeline stage)."""
    write_text_atomic(path, render_report(exp, summary, times, ranks))
