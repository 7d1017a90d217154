"""Where the step's time goes: the MFU waterfall, compute / exposed communication / idle per
pipeline rank, each stream's busy, overlapped and exposed time, and the collective table.

The waterfall splits the step T of an average GPU exactly (`metrics.RankTime`: compute +
exposed + idle = T), in fractions of T, from 100% of peak down to MFU:

    idle (bubble)                      idle / T                       (= the bubble metric)
    exposed communication              exposed / T
    variability (slowest ranks)        (compute - ideal compute) / T   (`[cluster] jitter`,
                                       `slow_nodes`; shown only when the cluster has some)
    kernel efficiency                  (ideal compute - hardware FLOPs / peak) / T
    recomputation                      recomputed FLOPs / peak / T
    FLOPs beyond the model count       (hardware - recomputed - model FLOPs) / peak / T
    MFU                                model FLOPs / peak / T

The four losses and MFU add up to 100%: T - idle - exposed - compute = 0.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from sim.config import Experiment
from sim.metrics import StepSummary, gemm_peak
from sim.report.collectives import CollectiveRow
from sim.report.timeline import PHASES, Lane, RankOps, lane_key, lane_usage
from sim.report.words import Words
from traces.chrome import binary_size
from traces.ops import Phase
from traces.step_flops import model_flops


@dataclass(frozen=True, slots=True, kw_only=True)
class Waterfall:
    """Fractions of the step (see the module docstring); they add up to 1."""

    idle: float
    exposed_comm: float
    kernel_efficiency: float
    recompute: float
    beyond_model: float
    mfu: float
    variability: float = 0.0
    """Kernel time the ranks spend slower than the plan (per-rank variability)."""

    def steps(self) -> list[tuple[str, float]]:
        varied = [("variability (slowest ranks)", self.variability)] if self.variability else []
        return [("idle (bubble)", self.idle), ("exposed communication", self.exposed_comm),
                *varied, ("kernel efficiency", self.kernel_efficiency),
                ("recomputation", self.recompute),
                ("FLOPs beyond the model count", self.beyond_model)]


def waterfall(exp: Experiment, summary: StepSummary, cols: Sequence[RankOps]) -> Waterfall:
    """`cols`: every simulated rank's ops (each is one GPU's program; a folded rank stands
    for identical ones)."""
    T, n = summary.step_time_s, len(cols)
    peak = gemm_peak(exp.model, exp.cluster.accelerator)  # the peak MFU is measured against
    recompute = PHASES.index(Phase.RECOMPUTE)
    hardware = sum(float(c.flops.sum()) for c in cols) / n
    recomputed = sum(float(c.flops[c.phase == recompute].sum()) for c in cols) / n
    model = model_flops(exp.model, exp.layout.global_batch) / exp.layout.world
    mean = {k: float(np.mean([getattr(r, k) for r in summary.ranks]))
            for k in ("compute_s", "exposed_comm_s", "idle_s")}
    varied = summary.variability_compute_s
    return Waterfall(idle=mean["idle_s"] / T, exposed_comm=mean["exposed_comm_s"] / T,
                     variability=varied / T,
                     kernel_efficiency=(mean["compute_s"] - varied - hardware / peak) / T,
                     recompute=recomputed / peak / T,
                     beyond_model=(hardware - recomputed - model) / peak / T,
                     mfu=model / peak / T)


def waterfall_figure(w: Waterfall, words: Words, precision: str = "bf16") -> go.Figure:
    """`precision`: what the peak is the dense peak of (`metrics.gemm_precision`)."""
    steps = w.steps()
    labels = [f"peak ({words.device} dense {precision})"] + [name for name, _ in steps] + ["MFU"]
    values = [1.0] + [-v for _, v in steps] + [0.0]
    fig = go.Figure(go.Waterfall(
        orientation="v", x=labels, y=values,
        measure=["absolute"] + ["relative"] * len(steps) + ["total"],
        text=[f"{abs(v):.1%}" for v in values[:-1]] + [f"{w.mfu:.1%}"],
        textposition="outside", connector={"line": {"color": "#888"}},
        decreasing={"marker": {"color": "#E45756"}},
        increasing={"marker": {"color": "#54A24B"}},
        totals={"marker": {"color": "#4C78A8"}},
        hovertemplate="%{x}: %{text} of peak<extra></extra>"))
    fig.update_layout(title="From peak to achieved: MFU waterfall, fractions of the step of "
                      f"an average {words.device}", yaxis={"tickformat": ".0%",
                                                           "range": [0, 1.12]},
                      height=420, showlegend=False)
    return fig


def breakdown_figure(summary: StepSummary, words: Words, stages: dict[int, int]) -> go.Figure:
    """Stacked compute / exposed communication / idle seconds per pipeline rank shown."""
    shown = {r.rank: r for r in summary.ranks}
    ranks = [shown[rank] for rank in stages.values()]
    x = [words.row(r.rank) for r in ranks]
    fig = go.Figure()
    for name, values, colour in (
            ("compute", [r.compute_s for r in ranks], "#4C78A8"),
            ("exposed communication", [r.exposed_comm_s for r in ranks], "#E45756"),
            ("idle (bubble)", [r.idle_s for r in ranks], "#BAB0AC")):
        fig.add_trace(go.Bar(name=name, x=x, y=values, marker_color=colour,
                             hovertemplate="%{x}: %{y:.4g} s<extra>" + name + "</extra>"))
    fig.update_layout(title="Compute, exposed communication and idle time, per pipeline rank",
                      barmode="stack", height=420, yaxis_title="seconds",
                      xaxis={"type": "category"})
    return fig


# --- tables -------------------------------------------------------------------------------------

def usage_by_lane(all_lanes: Sequence[Sequence[Lane]]) -> list[tuple[str, float, float, float]]:
    """(lane, busy, overlapped with kernels, exposed) in seconds, mean over the ranks given
    (a rank without the lane counts zero)."""
    totals: dict[str, list[float]] = {}
    for rank_lanes in all_lanes:
        for u in lane_usage(rank_lanes):
            t = totals.setdefault(u.name, [0.0, 0.0])
            t[0] += u.busy_s
            t[1] += u.overlapped_s
    n = max(len(all_lanes), 1)
    return [(name, busy / n, shared / n, (busy - shared) / n)
            for name, (busy, shared) in sorted(totals.items(), key=lambda kv: lane_key(kv[0]))]


def usage_table(rows: list[tuple[str, float, float, float]], step_s: float) -> str:
    head = ("<tr><th>lane</th><th>busy (s)</th><th>overlapped with kernels (s)</th>"
            "<th>exposed (s)</th><th>exposed, % of step</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{busy:.4g}</td><td>{shared:.4g}</td>"
        f"<td>{exposed:.4g}</td><td>{exposed / step_s:.1%}</td></tr>"
        for name, busy, shared, exposed in rows)
    return ("<h3>Per stream: busy, overlapped with compute, exposed (mean over the simulated "
            f"ranks)</h3><table class='grid'>{head}{body}</table>"
            "<p class='note'>The compute lane is the kernels; compute/tp the collectives "
            "Megatron runs inline on the compute stream, never overlapped. Exposed time of "
            "different lanes can coincide, so the column can add up to more than the step's "
            "exposed communication.</p>")


def collective_table(rows: list[CollectiveRow], num_ranks: int) -> str:
    head = ("<tr><th>carries</th><th>kind</th><th>group</th><th>bytes per call</th>"
            "<th>algorithm</th><th>calls per rank</th><th>time per call</th>"
            "<th>time per rank (s)</th><th>bus bandwidth (GB/s)</th><th>links' peak (GB/s)"
            "</th><th>of peak</th></tr>")
    body = []
    for r in rows:
        per_call = r.time_s / r.calls if r.calls else 0.0
        share = r.busbw_Bps / r.peak_busbw_Bps if r.peak_busbw_Bps > 0 else 0.0
        body.append(
            f"<tr><td>{html.escape(r.carries)}</td><td>{html.escape(r.kind)}</td>"
            f"<td>{r.group_size}</td><td>{binary_size(r.size_bytes)}</td>"
            f"<td>{html.escape(r.algo)}</td><td>{r.calls / num_ranks:.4g}</td>"
            f"<td>{_duration(per_call)}</td><td>{r.time_s / num_ranks:.4g}</td>"
            f"<td>{r.busbw_Bps / 1e9:.1f}</td><td>{r.peak_busbw_Bps / 1e9:.1f}</td>"
            f"<td>{share:.0%}</td></tr>")
    return ("<h3>Communication by kind (per rank: mean over the simulated ranks; pipeline "
            f"transfers counted at the sender)</h3><table class='grid'>{head}{''.join(body)}"
            "</table><p class='note'>Bus bandwidth as nccl-tests counts it; the links' peak "
            "is the same algorithm's flows on idle links with no latency or protocol "
            "overhead.</p>")


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"
