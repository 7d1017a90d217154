"""Micro-batch labels of the pipeline view (`sim.report.labels`): inside the passes that hold
their number, every n-th micro-batch where they are too narrow, never two on top of another;
and the view's buttons (warm-up, cool-down, whole step).

    pytest tests/sim/report/test_report_labels.py -q

The page's script runs the same rule (report.js `labelPlan`); tests/bench/bench_report.py
checks, in Chromium, that it labels the same passes at the page's own width and zoom.
"""

import pytest

from sim.report import read_payload, render_report
from sim.report.labels import (
    label_gap_s,
    label_plan,
    label_stride,
    label_width_px,
)
from sim.simulate import predict
from tests.sim.report.report_cases import PP4_M8, experiment, pass_points


def labels_of(figure):
    trace = next(t for t in figure["data"] if (t.get("meta") or {}).get("labels"))
    return list(zip(trace["y"], trace["x"], trace["text"], strict=True)), trace


def test_strides_run_1_2_5_10():
    # span 1 px per micro-batch, labels of 3 digits (22 px) + 2 px gap: n * 1 >= 48
    assert label_stride(1.0, 1.0, 22) == 50
    assert [label_stride(1.0, px, 22) for px in (48, 24, 10, 5, 2.4, 1.0, 0.5)] == \
        [1, 2, 5, 10, 20, 50, 100]
    assert label_stride(0.0, 100.0, 10) == 10**9  # one pass per kind: only rule 1 labels


def test_narrow_passes_get_every_nth_and_wide_ones_their_own():
    # one row: 100 forward passes of 1 ms every 10 ms, and one wide pass (mb 7 is 8 ms)
    bars = [(k * 0.01, k * 0.01 + (0.008 if k == 7 else 0.001), str(k), "F") for k in range(100)]
    gap = label_gap_s([bars])
    assert gap == pytest.approx(0.01)
    px = 1000.0  # 1 s across 1000 px: a pass 1 px, a span of micro-batches 10 px
    plan = label_plan([bars], 0.0, 1.0, px, gap)
    texts = [p.text for p in plan]
    # n = 5: 5 * 10 px >= 2 * (16 + 2); mb 7 (8 px) is too narrow for "7" (10 px)
    assert label_stride(gap, px, label_width_px("99")) == 5
    assert texts == [str(k) for k in range(0, 100, 5)]
    assert all(not p.inside for p in plan)
    # zoomed to a twentieth: every pass (20 px wide) holds its number
    zoomed = label_plan([bars], 0.0, 0.1, 20_000.0, gap)
    assert [(p.text, p.inside) for p in zoomed] == [(str(k), True) for k in range(10)]
    assert zoomed[7].x == pytest.approx(0.07 + 0.004)
    # half a pass visible at the edge: labelled on its visible part, if it holds the number
    edge = label_plan([bars], 0.0745, 0.2, 20_000.0, gap)
    assert (edge[0].text, edge[0].x) == ("7", pytest.approx((0.0745 + 0.078) / 2))


def test_a_label_inside_its_bar_is_never_dropped_for_a_neighbour():
    # mb 10 is narrow (stride label), mb 11 right after it is wide: 11 keeps its label
    bars = [(0.0, 0.001, "10", "F"), (0.001, 0.031, "11", "F")]
    plan = label_plan([bars], 0.0, 0.031, 1000.0, 0.001)
    assert [(p.text, p.inside) for p in plan] == [("11", True)]


def test_labels_of_one_row_never_overlap():
    bars = [(k * 0.003, k * 0.003 + 0.001, str(k), "F" if k % 2 else "B") for k in range(300)]
    for px in (300.0, 1000.0, 3000.0):
        plan = label_plan([bars], 0.0, 0.9, px, label_gap_s([bars]))
        edges = [((p.x * px) - label_width_px(p.text) / 2, (p.x * px) + label_width_px(p.text) / 2)
                 for p in plan]
        assert plan and all(edges[i][1] <= edges[i + 1][0] for i in range(len(edges) - 1))


def test_small_pipeline_labels_every_pass_inside_its_bar():
    exp = experiment(PP4_M8)
    summary, times = predict(exp)
    figure = read_payload(render_report(exp, summary, times))["figures"]["parasim-pipeline"]
    labels, trace = labels_of(figure)
    passes = [p for p in pass_points(figure) if p["mb"] != ""]
    assert sorted(labels) == sorted((p["row"], p["x"], p["mb"]) for p in passes)
    kinds = {(p["row"], p["x"]): p["kind"] for p in passes}
    # white inside a forward's blue, dark inside a backward's orange
    assert trace["textfont"]["color"] == ["white" if kinds[row, x] == "F" else "#1A1A1A"
                                          for row, x, _ in labels]


def test_view_buttons_zoom_to_the_warm_up_and_the_cool_down():
    """Over the pipeline: warm-up (to the first stage's first backward: the staircase),
    cool-down (from its last forward), whole step; the page's zoom handler takes the range
    (tests/bench/bench_report.py clicks warm-up in Chromium)."""
    exp = experiment(PP4_M8)
    summary, times = predict(exp)
    figure = read_payload(render_report(exp, summary, times))["figures"]["parasim-pipeline"]
    first = [p for p in pass_points(figure) if p["row"] == 0]
    warm = min(p["start"] for p in first if p["kind"] == "B")
    cool = max(p["end"] for p in first if p["kind"] == "F")
    step = times.step_time_s
    (menu,) = figure["layout"]["updatemenus"]
    views = {b["label"]: b["args"][0]["xaxis.range"] for b in menu["buttons"]}
    assert views == {"warm-up": [0.0, pytest.approx(1.05 * warm)],
                     "cool-down": [pytest.approx(cool - 0.05 * (step - cool)), step],
                     "whole step": [0.0, step]}
    assert all(b["method"] == "relayout" for b in menu["buttons"])
    # one stage has no staircase: no buttons
    exp = experiment(PP4_M8, pp=1, tp=2, dp=4)
    summary, times = predict(exp)
    one = read_payload(render_report(exp, summary, times))["figures"]["parasim-pipeline"]
    assert not one["layout"].get("updatemenus")
