"""The report of the shipped GPT-3 175B example (1024 A100s, 16 folded ranks): small, few
shapes, honest lanes, the bubble drawn as measured.

    pytest tests/sim/report/test_report_gpt3.py -q      # ~20 s: one simulation, one report

Load times in a browser are not tested here (no timed assertions): tests/bench/bench_report.py
opens the page in headless Chromium and prints them.
"""

import numpy as np
import pytest

from sim.config import example_path, load_experiment
from sim.report import read_payload, render_report
from sim.report.binned import decode_row
from sim.report.labels import NOMINAL_PLOT_PX, label_width_px
from sim.simulate import predict
from tests.sim.report.report_cases import drawn_shapes, lane_name, pass_points

MB = 1e6
pytestmark = pytest.mark.slow  # one 1024-GPU simulation and its report: ~20 s


@pytest.fixture(scope="module")
def gpt3():
    exp = load_experiment(example_path("gpt3-175b-1024-a100.toml"))
    summary, times = predict(exp)
    page = render_report(exp, summary, times)
    return exp, summary, times, page, read_payload(page)


def test_the_page_is_under_3_mb(gpt3):
    page = gpt3[3]
    assert len(page.encode("utf-8")) < 3 * MB


def test_shapes_stay_bounded(gpt3):
    """A few hundred drawn shapes (images, paths, bars), not one per op or pass; the
    pipeline's hover points are one per pass: 2 * 192 micro-batches * 16 stages + 16
    optimizer steps."""
    exp, _, _, _, payload = gpt3
    assert sum(drawn_shapes(payload).values()) < 1000
    L = exp.layout
    assert len(pass_points(payload["figures"]["parasim-pipeline"])) == \
        2 * L.num_microbatches * L.pp + L.pp == 6160


def test_no_communication_shape_spans_more_than_its_op(gpt3):
    _, _, times, _, payload = gpt3
    spec = next(s for s in payload["binned"] if s["div"] == "parasim-lanes")
    names = [t["meta"] for t in payload["figures"]["parasim-lanes"]["data"]]
    checked = 0
    for trace in spec["traces"]:
        where, lane = names[trace["index"]].split(" · ")
        if lane == "compute":
            continue
        rank = int(where.split(" r")[1])
        starts, ends = decode_row(trace["rows"][0])
        ops = [(s, e) for op, s, e in zip(times.plan.ops[rank], times.starts[rank],
                                          times.ends[rank]) if lane_name(op) == lane]
        assert len(starts) == len(ops)
        durations = np.array([e - s for s, e in ops]) * 1e9
        assert np.all(ends - starts <= durations + 1)  # each shape within its op (+1 ns rounding)
        checked += len(ops)
    assert checked > 10_000  # two ranks' TP collectives, sends and receives, gradient buckets


def test_the_bubble_drawn_is_the_metric(gpt3):
    _, summary, times, page, payload = gpt3
    idle = payload["binned"][0]["traces"][0]["rows"]
    pieces = [decode_row(row) for row in idle]
    total = sum(float(np.sum(e - s)) for s, e in pieces) / 1e9
    slack = sum(len(s) for s, _ in pieces) * 1e-9
    assert len(idle) == 16
    assert total == pytest.approx(summary.bubble_fraction * 16 * times.step_time_s, abs=slack)
    assert f"the bubble: {summary.bubble_fraction:.1%} of the step" in page


def test_rows_say_what_they_stand_for(gpt3):
    ticks = gpt3[4]["figures"]["parasim-pipeline"]["layout"]["yaxis"]["ticktext"]
    assert ticks[0] == "pp 0 · r0 · 64 GPUs" and ticks[-1] == "pp 15 · r960 · 64 GPUs"
    assert "stands for the 64 GPUs of its pipeline stage (tp 8 × dp 8)" in gpt3[3]


def test_micro_batch_labels_at_the_default_zoom(gpt3):
    """Passes are 2-5 px wide at the default zoom, too narrow for their numbers: every row
    carries micro-batches 0, 10, ..., 190 (forward and backward), each at the centre of that
    micro-batch's bar on that row, and no two overlap (sim.report.labels)."""
    figure = gpt3[4]["figures"]["parasim-pipeline"]
    trace = next(t for t in figure["data"] if (t.get("meta") or {}).get("labels"))
    centres = {(p["row"], p["x"]): p["mb"] for p in pass_points(figure)}
    step = gpt3[2].step_time_s
    px = NOMINAL_PLOT_PX / step
    by_row: dict[int, list[tuple[float, str]]] = {}
    for row, x, text in zip(trace["y"], trace["x"], trace["text"], strict=True):
        assert centres[row, x] == text  # the number of the bar it sits on
        by_row.setdefault(row, []).append((x, text))
    assert sorted(by_row) == list(range(16))
    for row, labels in by_row.items():
        assert sorted({int(t) for _, t in labels}) == list(range(0, 192, 10)), row
        widths = [label_width_px(t) for _, t in labels]
        for (x0, _), (x1, _), w0, w1 in zip(labels, labels[1:], widths, widths[1:]):
            assert (x1 - x0) * px >= (w0 + w1) / 2  # in drawing order, none on another
