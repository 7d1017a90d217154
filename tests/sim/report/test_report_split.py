"""The report's pipeline view under Megatron-Core's pipeline splits: 6 layers with the embedding
and the loss counted as layers over PP 4 x VP 2 give one layer a stage and none on the first
and the last (the embedding alone, the loss alone); each such pass is drawn on its own stage,
in the schedule's order, and lasts what its ops last."""

from __future__ import annotations

import pytest

from sim.report import read_payload, render_report
from sim.report.timeline import pipeline_passes
from sim.simulate import predict
from tests.sim.report.report_cases import PP4_M8, experiment, pass_points
from traces.pipeline import build_schedule

SPLIT = {**PP4_M8, "model": {**PP4_M8["model"], "layers": 6}}


@pytest.fixture(scope="module")
def split():
    exp = experiment(SPLIT, schedule="interleaved", vp=2, account_for_embedding=True,
                     account_for_loss=True)
    summary, times = predict(exp)
    return exp, times, read_payload(render_report(exp, summary, times))


def test_passes_of_stages_without_layers_run_in_the_schedule_order(split):
    exp, times, _ = split
    assert exp.layout.stage_layers(exp.model) == (0, 1, 1, 1, 1, 1, 1, 0)
    schedule = build_schedule("interleaved", 4, 8, 2)
    for rank in times.plan.ranks:
        passes = pipeline_passes(times, rank)
        assert [p.action for p in passes[:-1]] == schedule[exp.layout.coords(rank).pp]


def test_the_view_shows_the_end_stages_lighter(split):
    """Rank 0's stage 0 (the embedding alone) and rank 3's stage 7 (the loss alone) are bars
    of their own; the embedding's forward is shorter than a one-layer stage's."""
    exp, times, payload = split
    bars = pass_points(payload["figures"]["parasim-pipeline"])
    hover = {(b["row"], b["kind"], b["hover"].split(":")[0]) for b in bars if b["kind"] != "O"}
    assert (0, "F", "stage 0") in hover and (0, "F", "stage 4") in hover
    assert (3, "F", "stage 7") in hover and (3, "B", "stage 7") in hover
    first = [b for b in bars if b["row"] == 0 and b["kind"] == "F"]
    embedding = [b["duration"] for b in first if b["hover"].startswith("stage 0:")]
    layer = [b["duration"] for b in first if b["hover"].startswith("stage 4:")]
    assert len(embedding) == len(layer) == 8 and max(embedding) < min(layer)
