"""The HTML step report: self-contained, deterministic, coalesced timeline, atomic writes.

    pytest tests/sim/test_report.py -q

A tiny GPT (4 layers, hidden 64) on one DGX H100 with TP 2 x PP 2 x DP 2 and 4 micro-batches,
so every count below can be worked out by hand.
"""

import base64
import dataclasses
import json
from itertools import groupby

import numpy as np
import pytest

import sim.report as report
from sim.config import Experiment, experiment_from_dict
from sim.metrics import StepSummary
from sim.replay import StepTimes
from sim.report import TP_LANE, Bar, coalesce, default_ranks, timeline_bars, write_report
from sim.simulate import predict
from traces.errors import ConfigError
from traces.ops import OpKind, Trace

CONFIG = {
    "model": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128},
    "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch": 8},
    "cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 8},
}
M = 4  # micro-batches: global batch 8 / (micro-batch 1 * dp 2)


@pytest.fixture(scope="module")
def exp() -> Experiment:
    return experiment_from_dict(CONFIG, name="tiny-gpt")


@pytest.fixture(scope="module")
def folded(exp: Experiment) -> tuple[StepSummary, StepTimes]:
    return predict(exp)


def timeline_data(path) -> list[dict]:
    """The timeline figure's traces, as plotly wrote them into the page."""
    page = path.read_text(encoding="utf-8")
    at = page.index('"parasim-timeline",')
    data, _ = json.JSONDecoder().raw_decode(page[page.index("[", at):])
    return data


def lane_of(op) -> str:
    """Written apart from sim.report: TP collectives get a lane beside the compute stream."""
    inline_collective = op.stream == "compute" and op.kind is not OpKind.COMPUTE
    return TP_LANE if inline_collective else op.stream


def expected_runs(plan: Trace, rank: int) -> int:
    """Runs of equal (kind class, micro-batch, phase) along each lane, by itertools.groupby."""
    ops = plan.ops[rank]
    total = 0
    for lane in {lane_of(op) for op in ops}:
        keys = [(op.kind is OpKind.COMPUTE, op.microbatch, op.phase)
                for op in ops if lane_of(op) == lane]
        total += sum(1 for _ in groupby(keys))
    return total


# --- the page ------------------------------------------------------------------------------

def test_report_is_one_self_contained_page(tmp_path, exp, folded):
    summary, times = folded
    path = tmp_path / "step.html"
    write_report(path, exp, summary, times)
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<h1>parasim: tiny-gpt</h1>" in page
    assert "dgx-h100" in page and "TP 2 · PP 2 · DP 2 · VP 1" in page
    assert f"{summary.step_time_s:.4g} s" in page and "fits" in page
    # plotly.js inlined exactly once (the offline bundle); nothing loaded from elsewhere.
    assert page.count("plotly.js v") == 1 and "<script src" not in page
    for div in ("parasim-timeline", "parasim-breakdown", "parasim-memory"):
        assert f'id="{div}"' in page


def test_same_inputs_give_the_same_bytes(tmp_path, exp, folded):
    summary, times = folded
    first, second, third = (tmp_path / f"{n}.html" for n in ("a", "b", "c"))
    write_report(first, exp, summary, times)
    write_report(second, exp, summary, times)
    write_report(third, exp, *predict(exp))  # a fresh simulation of the same experiment
    assert first.read_bytes() == second.read_bytes() == third.read_bytes()


def test_header_escapes_the_experiment_name(tmp_path, exp, folded):
    path = tmp_path / "step.html"
    write_report(path, dataclasses.replace(exp, name="<b>&evil"), *folded)
    page = path.read_text(encoding="utf-8")
    assert "parasim: &lt;b&gt;&amp;evil" in page and "<b>&evil" not in page


# --- the timeline --------------------------------------------------------------------------

def test_bar_count_matches_the_schedule_by_hand(tmp_path, exp, folded):
    # Per pipeline rank under 1F1B, no two consecutive passes share a micro-batch, so each lane
    # has one bar per pass: compute 2M + optimizer, TP 2M, two p2p lanes with M each, and dp
    # the gradient bucket plus the tied-embedding all-reduce: 6M + 3 = 27 bars per rank.
    summary, times = folded
    assert default_ranks(times.plan) == times.plan.ranks == [0, 4]
    for rank in times.plan.ranks:
        assert expected_runs(times.plan, rank) == 6 * M + 3
    path = tmp_path / "step.html"
    write_report(path, exp, summary, times)
    data = timeline_data(path)
    assert sum(len(trace["base"]) for trace in data) == 2 * (6 * M + 3)
    assert len(times.plan.ops[0]) > 6 * M + 3  # coalescing did merge something


def test_every_op_lies_inside_a_bar_of_its_lane(folded):
    _, times = folded
    for rank in times.plan.ranks:
        ops, starts, ends = times.plan.ops[rank], times.starts[rank], times.ends[rank]
        bars = coalesce(rank, ops, starts, ends)
        assert len(bars) == expected_runs(times.plan, rank) < len(ops)
        by_lane: dict[str, list[Bar]] = {}
        for bar in bars:
            by_lane.setdefault(bar.lane, []).append(bar)
        for op, start, end in zip(ops, starts, ends):
            lane = by_lane[lane_of(op)]
            assert any(b.start <= start and end <= b.end and b.microbatch == op.microbatch
                       for b in lane), (rank, op)
        for lane, mine in by_lane.items():  # nothing lost: busy time and op count add up
            members = [(s, e) for op, s, e in zip(ops, starts, ends) if lane_of(op) == lane]
            assert sum(b.num_ops for b in mine) == len(members)
            assert sum(b.busy_s for b in mine) == pytest.approx(sum(e - s for s, e in members))
            assert all(a.end <= b.start + 1e-12 for a, b in zip(mine, mine[1:]))


def test_categories_colour_what_the_plan_holds(tmp_path, exp, folded):
    path = tmp_path / "step.html"
    write_report(path, exp, *folded)
    names = [trace["name"] for trace in timeline_data(path)]
    assert names == ["forward compute", "backward compute", "optimizer",
                     "tensor-parallel collective", "pipeline send/recv",
                     "data-parallel / ZeRO collective"]


def test_unfolded_plan_shows_the_lowest_rank_of_each_stage(tmp_path, exp):
    summary, times = predict(exp, fold=False)
    assert len(times.plan.ops) == 8 and default_ranks(times.plan) == [0, 4]
    rows = {bar.rank for bar in timeline_bars(times, default_ranks(times.plan))}
    assert rows == {0, 4}
    path = tmp_path / "step.html"
    write_report(path, exp, summary, times, ranks=[5])
    rows_y = np.concatenate([np.frombuffer(base64.b64decode(t["y"]["bdata"]), t["y"]["dtype"])
                             for t in timeline_data(path)])
    assert set(rows_y) == set(range(5))  # r5: compute, compute/tp, recv_prev, send_prev, dp
    assert "r5 pp1 compute" in path.read_text(encoding="utf-8")


def test_unknown_rank_is_a_user_error(tmp_path, exp, folded):
    with pytest.raises(ConfigError, match="rank 3 is not in the simulated plan"):
        write_report(tmp_path / "step.html", exp, *folded, ranks=[3])
    assert list(tmp_path.iterdir()) == []


# --- atomic writes ---------------------------------------------------------------------------

def test_failed_rendering_leaves_nothing(tmp_path, monkeypatch, exp, folded):
    def boom(*args, **kwargs):
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(report.pio, "to_html", boom)
    with pytest.raises(RuntimeError, match="rendering failed"):
        write_report(tmp_path / "step.html", exp, *folded)
    assert list(tmp_path.iterdir()) == []


def test_failed_rename_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch, exp, folded):
    path = tmp_path / "step.html"
    path.write_text("old report")

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("traces.files.os.replace", no_rename)
    with pytest.raises(ConfigError, match="cannot write: No space left on device"):
        write_report(path, exp, *folded)
    assert list(tmp_path.iterdir()) == [path] and path.read_text() == "old report"


def test_missing_directory_is_a_user_error(tmp_path, exp, folded):
    with pytest.raises(ConfigError, match="cannot write"):
        write_report(tmp_path / "nope" / "step.html", exp, *folded)
