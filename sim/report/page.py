"""The report page: header, the views in reading order, and one self-contained file.

Reading order: the headline figures; the pipeline view; where the time goes (MFU waterfall,
per-rank breakdown, per-stream and per-collective tables); lanes of the chosen ranks; memory
over time and at the peak.

Self-contained and small: plotly.js (4.8 MB) and the figures travel deflated and base64-coded
inside the page (about 2 MB for plotly.js) and `report.js` unpacks them with the browser's
DecompressionStream, so the page opens offline. Deterministic: fixed div ids, no timestamps,
zlib at a fixed level; the same inputs give the same bytes.
"""

from __future__ import annotations

import base64
import html
import json
import zlib
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from sim.config import Experiment
from sim.engine.replay import StepTimes
from sim.metrics import StepSummary, gemm_precision
from sim.report.about import about_html
from sim.report.breakdown import (
    breakdown_figure,
    collective_table,
    usage_by_lane,
    usage_table,
    waterfall,
    waterfall_figure,
)
from sim.report.collectives import CommIndex, collective_rows
from sim.report.lanes import lanes_view
from sim.report.memory_view import (
    memory_by_pp_rank_figure,
    memory_curves,
    memory_over_time_figure,
)
from sim.report.pipeline import legend_html, pipeline_view
from sim.report.plotly_page import ZLIB_LEVEL, plotly_b64
from sim.report.timeline import lanes, present_pp_ranks, rank_ops
from sim.report.words import Words, words_for
from sim.simulate import headline, model_summary
from traces.errors import ConfigError
from traces.files import write_text_atomic

DIVS = ("parasim-pipeline", "parasim-waterfall", "parasim-breakdown", "parasim-lanes",
        "parasim-memory-time", "parasim-memory")
TIMED = ("parasim-pipeline", "parasim-lanes", "parasim-memory-time")
"""Figures whose x axis is the step's time: zooming one zooms them all."""


def render_report(exp: Experiment, summary: StepSummary, times: StepTimes,
                  ranks: list[int] | None = None, about: str = "") -> str:
    """The whole HTML page as a string (deterministic). `ranks` picks the ranks whose lanes
    are drawn (default: the first and the last pipeline stage's); `about` is what the config
    says of itself (`sim.report.about.opening_comment`), shown under the headline."""
    words = words_for(exp, times)
    stages = present_pp_ranks(times)
    detail, notes = detail_ranks(times, stages, ranks)
    comm = CommIndex(exp, times)
    cols = {rank: rank_ops(times, rank) for rank in times.plan.ranks}
    rank_lanes = {rank: lanes(c) for rank, c in cols.items()}
    L = exp.layout
    pipe = pipeline_view(times, cols, stages, words, (
        f"Pipeline: {L.schedule}, {L.num_microbatches} micro-batches through {L.pp} "
        f"stage{'s' if L.pp > 1 else ''}{f' × {L.vp} chunks' if L.vp > 1 else ''}"),
        "parasim-pipeline")
    lane_view = lanes_view(times, rank_lanes, detail, words, comm, (
        "Lanes of " + ", ".join(words.row(r) for r in detail)
        + ": colour depth is the busy fraction of each bin; zoom in to reach single ops"),
        "parasim-lanes")
    figures: dict[str, go.Figure] = {
        "parasim-pipeline": pipe.figure,
        "parasim-waterfall": waterfall_figure(waterfall(exp, summary, list(cols.values())), words,
                                              gemm_precision(exp.model)),
        "parasim-breakdown": breakdown_figure(summary, words, stages),
        "parasim-lanes": lane_view.figure,
        "parasim-memory-time": memory_over_time_figure(
            memory_curves(exp, pipe.passes), summary.memory_capacity_bytes, words,
            times.step_time_s),
        "parasim-memory": memory_by_pp_rank_figure(summary, words),
    }
    tables = (usage_table(usage_by_lane(list(rank_lanes.values())), times.step_time_s)
              + collective_table(collective_rows(times, comm, cols), len(times.plan.ops)))
    payload = _payload(figures, [pipe.spec.to_json(), lane_view.spec.to_json()])
    heights = {div: int(fig.layout.height) for div, fig in figures.items()}
    body = _body(exp, summary, words, pipe.bubble_fraction, tables, notes, heights,
                 hint_ranks(times, detail), about)
    return ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
            f"<title>parasim: {html.escape(exp.name)}</title><style>{_STYLE}</style></head>\n"
            f"<body>\n{body}\n"
            f"<script id='parasim-plotly' type='application/octet-stream'>{plotly_b64()}"
            "</script>\n"
            f"<script id='parasim-data' type='application/octet-stream'>{payload}</script>\n"
            f"<script>{_script()}</script>\n</body></html>\n")


def write_report(path: str | Path, exp: Experiment, summary: StepSummary, times: StepTimes,
                 ranks: list[int] | None = None, about: str = "") -> None:
    """Render the report and write it to `path` atomically."""
    write_text_atomic(path, render_report(exp, summary, times, ranks, about))


def detail_ranks(times: StepTimes, stages: dict[int, int],
                 ranks: list[int] | None) -> tuple[list[int], list[str]]:
    """The plan ranks whose lanes are drawn, and notes on ranks shown by a representative.
    A rank of a folded plan's layout that was not simulated is shown by the rank standing
    for it."""
    if ranks is None:
        shown = list(stages.values())
        return list(dict.fromkeys([shown[0], shown[-1]])), []
    fold = times.plan.meta.fold
    out, notes = [], []
    for rank in ranks:
        if rank in times.plan.ops:
            out.append(rank)
        elif (by := times.fold or fold) is not None and 0 <= rank < by.world:
            stand_in = by.representative(rank)
            notes.append(f"rank {rank} is shown by rank {stand_in}, which stands for it")
            out.append(stand_in)
        else:
            present = times.plan.ranks
            raise ConfigError(f"report: rank {rank} is not in the simulated plan (ranks "
                              f"present: {present[:8]}{' ...' if len(present) > 8 else ''})")
    return list(dict.fromkeys(out)), notes


def hint_ranks(times: StepTimes, shown: list[int]) -> list[int]:
    """Two ranks of this run for the page's `--report-ranks` hint: the first and the last
    not drawn already (each one `detail_ranks` accepts)."""
    layout, fold = times.plan.meta.layout, times.plan.meta.fold
    world = fold.world if fold is not None else layout.world if layout is not None else 0
    every = list(range(world)) if world else list(times.plan.ranks)
    other = [r for r in every if r not in shown] or every
    return list(dict.fromkeys([other[0], other[-1]]))


def read_payload(page: str) -> dict[str, Any]:
    """The figures and lane data a page carries (for tests and the browser benchmark)."""
    at = page.index("<script id='parasim-data'")
    start = page.index(">", at) + 1
    text = page[start:page.index("</script>", start)]
    return json.loads(zlib.decompress(base64.b64decode(text)))


# --- the pieces ---------------------------------------------------------------------------------

def _payload(figures: dict[str, go.Figure], binned: list[dict[str, Any]]) -> str:
    # plotly's own encoder writes numpy arrays as base64 typed arrays (float64 stays exact)
    parts = [f"{json.dumps(div)}:{pio.to_json(fig, validate=False, engine='json')}"
             for div, fig in figures.items()]
    text = ("{\"figures\":{" + ",".join(parts) + "},\"binned\":"
            + json.dumps(binned, separators=(",", ":"), allow_nan=False)
            + ",\"timed\":" + json.dumps(list(TIMED))
            + ",\"pipeline\":\"parasim-pipeline\"}")
    return base64.b64encode(zlib.compress(text.encode("utf-8"), ZLIB_LEVEL)).decode("ascii")


@lru_cache(maxsize=1)
def _script() -> str:
    return resources.files("sim.report").joinpath("report.js").read_text(encoding="utf-8")


def _body(exp: Experiment, summary: StepSummary, words: Words, bubble: float, tables: str,
          notes: list[str], heights: dict[str, int], hint: list[int], about: str) -> str:
    def div(name: str) -> str:
        # the figure's height on its box: plotly's responsive resizing keeps the box's height
        # (without it a resized window squeezes every figure to the box's minimum)
        return f"<div id='{name}' class='figure' style='height:{heights[name]}px'></div>"

    return "\n".join([
        header_html(exp, summary, words),
        about_html(about),
        "<h2>Pipeline</h2>",
        f"<p class='note'>{legend_html()}</p>",
        "<p class='note'>One row per pipeline rank; a number inside a pass is its "
        "micro-batch; where passes are too narrow for theirs, every n-th micro-batch is "
        "written over its pass (zoom in for the rest). Grey is idle time (the "
        f"bubble: {bubble:.1%} of the step, mean over the rows), "
        "red communication outside the passes (pipeline sends and receives, gradient "
        "reduction). A bin's colour is as deep as the share of it each kind covers; zooming "
        "re-bins, and zooms the lanes and the memory curve too; the buttons over it go to "
        "the warm-up (the staircase), the cool-down, or back to the whole step.</p>",
        div("parasim-pipeline"),
        "<h2>Where the time goes</h2>",
        div("parasim-waterfall"), div("parasim-breakdown"), tables,
        "<h2>Lanes</h2>",
        *(f"<p class='note'>{html.escape(n)}</p>" for n in notes),
        "<p class='note'>Each row is a stream of one rank (compute: kernels; compute/tp: the "
        "collectives run inline on the compute stream). A bin's colour is the share of it the "
        "stream is busy; hover for the numbers, and, zoomed in, the op itself. "
        f"<code>parasim simulate --report-ranks {','.join(map(str, hint))}</code> picks "
        "other ranks.</p>",
        div("parasim-lanes"),
        "<h2>Memory</h2>",
        div("parasim-memory-time"), div("parasim-memory"),
    ])


def header_html(exp: Experiment, summary: StepSummary, words: Words) -> str:
    """Experiment, cluster, layout, the headline figures, and what a row stands for."""
    L, s, m = exp.layout, summary, exp.model
    layout = L.axes()
    options = (f"ZeRO-{L.zero}, SP {'on' if L.sp else 'off'}, recompute {L.recompute}, "
               f"schedule {L.schedule}, {L.num_microbatches} micro-batches of {L.micro_batch} "
               f"(global batch {L.global_batch})")
    rows = [(k.replace("GPU", words.device), v.replace("GPU", words.device))
            for k, v in headline(s)]
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                    for k, v in rows)
    fold = fold_note(words) if words.stands_for > 1 else ""
    lines = [
        f"<h1>parasim: {html.escape(exp.name)}</h1>",
        f"<p>cluster <b>{html.escape(exp.cluster.name)}</b> ({words.count(L.world)}, "
        f"{html.escape(exp.cluster.accelerator.name)}), network model "
        f"{html.escape(exp.network)}, collectives {html.escape(exp.algo)}</p>",
        f"<p>model: {m.layers} layers, hidden {m.hidden}, {m.heads} heads, sequence "
        f"{m.seq_len}, vocabulary {m.vocab}, attention "
        f"{html.escape(m.attention)}; {html.escape(model_summary(m))}</p>",
        f"<p>layout: <b>{layout}</b>; {html.escape(options)}</p>",
        fold,
        f"<table>{table}</table>",
        "<p>collectives run: " + html.escape(", ".join(
            f"{algo} {count}" for algo, count in s.algorithms.items()) or "none") + "</p>",
    ]
    lines += [f"<p class='warn'>warning: {html.escape(w)}</p>" for w in exp.warnings]
    return "\n".join(line for line in lines if line)


def fold_note(words: Words) -> str:
    """What a folded rank stands for: all of its stage, or (where the network tells a stage's
    CP ranks apart) its share, the pipeline view showing the stage's first simulated rank."""
    n, stage = words.stands_for, words.stage_devices
    if stage <= n:
        return (f"<p>Folded: each simulated rank stands for the {words.count(n)} of its "
                f"pipeline stage ({html.escape(words.fold)}), which run the same program; "
                "rows say how many devices they stand for.</p>")
    return (f"<p>Folded: each simulated rank stands for {words.count(n)} "
            f"({html.escape(words.fold)}) of its pipeline stage's {stage:,}, which run the "
            f"same program; the stage's {stage // n} simulated ranks (one per CP coordinate "
            f"modulo {stage // n}) sit apart on the network, and the pipeline view shows the "
            "first of each stage. Rows say how many devices they stand for.</p>")


_STYLE = ("body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1800px}"
          "table{border-collapse:collapse}th,td{padding:2px 12px;text-align:left}"
          "th{font-weight:normal;color:#555}.warn{color:#a60}.note{color:#555;font-size:90%}"
          "table.grid td,table.grid th{border-bottom:1px solid #ddd;text-align:right}"
          "table.grid td:first-child,table.grid th:first-child{text-align:left}"
          "h2{margin-top:1.6em;border-bottom:1px solid #ccc}"
          ".key{display:inline-block;width:1em;height:1em;margin:0 .3em 0 1em;"
          "vertical-align:middle}")
