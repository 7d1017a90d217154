"""Memory: over the step per pipeline rank (activations building up through the warm-up and
freed in the cool-down, from `sim.models.memory.memory_timeline` at the simulated times), and at the
peak per pipeline rank by kind (`sim.models.memory.pp_rank_memory`), both against the device's
capacity.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from sim.config import Experiment
from sim.metrics import StepSummary
from sim.models.memory import memory_timeline
from sim.report.memory_scale import MemoryScale
from sim.report.timeline import Pass, timed_actions
from sim.report.words import Words

PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6",
           "#9D755D", "#BAB0AC", "#EECA3B")


def memory_curves(exp: Experiment, passes: dict[int, list[Pass]]
                  ) -> dict[int, list[tuple[float, float]]]:
    """Pipeline rank -> (time, bytes) points of its step curve."""
    return {pp: memory_timeline(exp.model, exp.layout, pp, timed_actions(ps),
                                exp.cluster.devices_per_server,
                                exp.cluster.accelerator.fp8_block_scaling)
            for pp, ps in passes.items()}


def memory_over_time_figure(curves: dict[int, list[tuple[float, float]]], capacity: float,
                            words: Words, step_s: float) -> go.Figure:
    """A step line per pipeline rank, its peak marked, the capacity dashed. Beyond
    MAX_LINES ranks the `shown_pp_ranks` are drawn and the others wait in the legend (one
    click away), each peak still marked."""
    fig = go.Figure()
    peaks_x, peaks_y, peaks_text = [], [], []
    shown = shown_pp_ranks(curves)
    scale = MemoryScale.of(max(b for points in curves.values() for _, b in points), capacity)
    unit = scale.unit
    for pp, points in curves.items():
        t = np.array([p[0] for p in points])
        gib = np.array([p[1] for p in points]) / scale.size
        colour = PALETTE[shown.index(pp) % len(PALETTE)] if pp in shown else "#BBBBBB"
        fig.add_trace(go.Scatter(
            x=t, y=gib.astype(np.float32), mode="lines", line={"shape": "hv", "width": 1.5,
                                                              "color": colour},
            visible=True if pp in shown else "legendonly",
            name=f"pp {pp}", hovertemplate=f"pp {pp}: %{{y:.2f}} {unit} from %{{x:.4f}} s"
                                           "<extra></extra>"))
        top = int(np.argmax(gib))
        peaks_x.append(t[top])
        peaks_y.append(gib[top])
        peaks_text.append(f"pp {pp}")
    fig.add_trace(go.Scatter(x=peaks_x, y=peaks_y, mode="markers", name="peak",
                             marker={"symbol": "triangle-down", "size": 9, "color": "#C00000"},
                             text=peaks_text,
                             hovertemplate=f"%{{text}} peak %{{y:.2f}} {unit} at %{{x:.4f}} s"
                                           "<extra></extra>"))
    capacity_line(fig, scale, words.device)
    fig.update_layout(
        title=(f"Memory of one {words.device} over the step, per pipeline rank<br><sup>model "
               "states, stored activations (a micro-batch's from its forward to its "
               "backward), working buffers while a pass runs</sup>"
               + (f"<br><sup>pp {', '.join(map(str, shown))} drawn (first, middle, last, "
                  "highest peak); click the legend for the others</sup>"
                  if len(shown) < len(curves) else "")),
        height=440, yaxis={"title": unit, "rangemode": "tozero"},
        xaxis={"title": "time (s)", "range": [0, step_s] if step_s > 0 else None},
        hovermode="closest")
    return fig


MAX_LINES = 4
"""Memory curves drawn at once; more overlap into a tangle (GPT-3's 16 stages)."""


def shown_pp_ranks(curves: dict[int, list[tuple[float, float]]]) -> list[int]:
    """The pipeline ranks drawn at first: all up to MAX_LINES, else the first, the middle,
    the last and the one with the highest peak (the first stage's, usually: it holds the
    most micro-batches' activations), in pipeline order."""
    ranks = list(curves)
    if len(ranks) <= MAX_LINES:
        return ranks
    top = max(ranks, key=lambda pp: (max(b for _, b in curves[pp]), -pp))
    picks = {ranks[0], ranks[len(ranks) // 2], ranks[-1], top}
    return sorted(picks)


def memory_by_pp_rank_figure(summary: StepSummary, words: Words) -> go.Figure:
    """Stacked memory per pipeline rank at its peak, with the capacity as a dashed line."""
    x = [f"pp {i}" for i in range(len(summary.memory_by_pp_rank))]
    scale = MemoryScale.of(max(m.total_bytes for m in summary.memory_by_pp_rank),
                           summary.memory_capacity_bytes)
    fig = go.Figure()
    for name, attr, colour in (("parameters", "params_bytes", "#4C78A8"),
                               ("gradients", "grads_bytes", "#F58518"),
                               ("optimizer state", "optimizer_bytes", "#54A24B"),
                               ("activations", "activations_bytes", "#B279A2"),
                               ("working buffers", "working_bytes", "#9D9D9D")):
        values = [getattr(m, attr) / scale.size for m in summary.memory_by_pp_rank]
        fig.add_trace(go.Bar(name=name, x=x, y=values, marker_color=colour,
                             hovertemplate=f"%{{x}}: %{{y:.2f}} {scale.unit}<extra>{name}"
                                           "</extra>"))
    capacity_line(fig, scale, words.device)
    fig.update_layout(title=f"Memory per {words.device} at its peak, per pipeline rank",
                      barmode="stack", height=420, yaxis_title=scale.unit,
                      xaxis={"type": "category"})
    return fig


def capacity_line(fig: go.Figure, scale: MemoryScale, device: str) -> None:
    """The device's memory dashed across the chart, labelled; or, far above the peaks, only
    named over the chart's top left (`MemoryScale`)."""
    if scale.capacity_drawn:
        fig.add_hline(y=scale.capacity_bytes / scale.size,
                      line={"dash": "dash", "color": "#C00000"},
                      annotation_text=scale.capacity_text(device),
                      annotation_position="top left")
    else:
        fig.add_annotation(x=0, y=1, xref="paper", yref="paper", xanchor="left",
                           yanchor="bottom", showarrow=False,
                           text=scale.capacity_text(device))
