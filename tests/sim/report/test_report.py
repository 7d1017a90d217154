"""The HTML step report: what it draws is the simulated step, exactly; the page is one
self-contained, deterministic file written atomically.

    pytest tests/sim/report/test_report.py -q

Small GPTs on one DGX H100 (`report_cases`): TP 2 x PP 4 with 8 micro-batches under 1F1B (the
pipeline the issue names), and TP 2 x PP 2 x DP 2 with full recomputation.
"""

import base64
import dataclasses
import gzip
import json
import re
import zlib
from collections import defaultdict

import numpy as np
import pytest

import sim.report.page as page_module
from sim.report import read_payload, render_report, write_report
from sim.report.binned import NUM_BINS, binned_z, decode_row
from sim.report.breakdown import waterfall
from sim.report.collectives import CommIndex, collective_rows
from sim.report.labels import NOMINAL_PLOT_PX
from sim.report.timeline import rank_ops
from sim.simulate import GiB, predict
from tests.sim.report.report_cases import (
    PP4_M8,
    TP2_PP2_DP2,
    drawn_shapes,
    experiment,
    lane_name,
    pass_points,
    typed,
)
from traces.errors import ConfigError
from traces.ops import OpKind, Phase, Stream
from traces.pipeline import one_f_one_b


@pytest.fixture(scope="module")
def pp4():
    exp = experiment(PP4_M8)
    summary, times = predict(exp)
    page = render_report(exp, summary, times)
    return exp, summary, times, page, read_payload(page)


@pytest.fixture(scope="module")
def small():
    exp = experiment(TP2_PP2_DP2)
    summary, times = predict(exp)
    return exp, summary, times


# --- the page ------------------------------------------------------------------------------

def test_report_is_one_self_contained_page(pp4):
    exp, summary, _, page, payload = pp4
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<h1>parasim: tiny-gpt</h1>" in page and "dgx-h100" in page
    assert "layout: <b>TP 2 · PP 4 · DP 1</b>;" in page  # the summary's label: no VP 1
    assert f"{summary.step_time_s:.4g} s" in page
    # plotly.js travels inside the page (deflated), nothing is loaded from elsewhere
    blob = re.search(r"<script id='parasim-plotly'[^>]*>([^<]*)</script>", page)[1]
    library = zlib.decompress(base64.b64decode(blob)).decode()
    assert "plotly.js v" in library[:200] and "<script src" not in page
    assert "DecompressionStream" in page
    for div in page_module.DIVS:
        assert f"id='{div}'" in page and div in payload["figures"]


def test_same_inputs_give_the_same_bytes(tmp_path, pp4):
    exp, summary, times, page, _ = pp4
    first, second = tmp_path / "a.html", tmp_path / "b.html"
    write_report(first, exp, summary, times)
    write_report(second, exp, *predict(exp))  # a fresh simulation of the same experiment
    assert first.read_text(encoding="utf-8") == page
    assert first.read_bytes() == second.read_bytes()


def test_header_escapes_the_experiment_name(pp4):
    exp, summary, times, _, _ = pp4
    page = render_report(dataclasses.replace(exp, name="<b>&evil"), summary, times)
    assert "parasim: &lt;b&gt;&amp;evil" in page and "<b>&evil" not in page


# --- the pipeline view ---------------------------------------------------------------------

def test_pipeline_bars_are_the_schedule_at_the_simulated_times(pp4):
    """Per pipeline rank, the F/B bars follow 1F1B's order, and each bar runs from the first
    to the last op of its pass as the replay timed them, read off the plan here."""
    _, _, times, _, payload = pp4
    bars = pass_points(payload["figures"]["parasim-pipeline"])
    schedule = one_f_one_b(4, 8)
    assert times.plan.ranks == [0, 2, 4, 6]  # folded: one rank per stage (tp 2)
    for row, rank in enumerate(times.plan.ranks):
        mine = sorted((b for b in bars if b["row"] == row), key=lambda b: b["start"])
        assert [(b["kind"], int(b["mb"]) if b["mb"] else None) for b in mine] == \
            [(a.kind, a.microbatch) for a in schedule[row]] + [("O", None)]
        spans = defaultdict(list)  # (F|B|O, micro-batch) -> times of its compute-stream ops
        for op, s, e in zip(times.plan.ops[rank], times.starts[rank], times.ends[rank]):
            if op.stream == Stream.COMPUTE:
                kind = ("O" if op.microbatch is None else
                        "F" if op.phase is Phase.FWD else "B")
                spans[kind, op.microbatch].append((s, e))
        for bar in mine:
            got = spans[bar["kind"], int(bar["mb"]) if bar["mb"] else None]
            assert bar["start"] == min(s for s, _ in got)  # exactly, not approximately
            assert bar["end"] == max(e for _, e in got)


def test_hover_duration_is_end_minus_start(pp4):
    bars = pass_points(pp4[4]["figures"]["parasim-pipeline"])
    assert len(bars) == 4 * (2 * 8 + 1)
    for bar in bars:
        assert bar["duration"] == bar["end"] - bar["start"] > 0
        assert bar["x"] == (bar["start"] + bar["end"]) / 2
    backward = next(b for b in bars if b["kind"] == "B")
    assert backward["hover"].startswith("stage ") and "kernels" in backward["hover"]
    # the page's script shows them through an invisible heatmap on top of the view
    figure = pp4[4]["figures"]["parasim-pipeline"]
    assert figure["data"][-1]["meta"] == {"hover": True}
    assert figure["data"][-1]["hovertemplate"] == "%{text}<extra></extra>"


def test_the_bubble_drawn_is_the_metric(pp4):
    _, summary, times, page, payload = pp4
    spec = payload["binned"][0]
    assert spec["div"] == "parasim-pipeline"
    idle = spec["traces"][0]["rows"]  # the bottom layer: idle time, one row per stage
    pieces = [decode_row(row) for row in idle]
    total_ns = sum(float(np.sum(e - s)) for s, e in pieces)
    step = times.step_time_s
    # each piece's ends are rounded to the nanosecond: at most 1 ns off per piece
    slack = sum(len(s) for s, _ in pieces) * 1e-9 / (len(idle) * step)
    assert total_ns / 1e9 / (len(idle) * step) == pytest.approx(summary.bubble_fraction,
                                                                abs=slack)
    # binned, the same total: bins keep time exactly
    width = step / NUM_BINS
    binned = sum(float(np.sum(binned_z(row, 0, step))) * width for row in idle)
    assert binned == pytest.approx(total_ns / 1e9, abs=len(idle) * 1e-9)  # ns rounding
    assert f"{summary.bubble_fraction:.1%} of the step" in page
    assert 0.1 < summary.bubble_fraction < 0.9  # a real bubble: pp 4, m 8


def test_layers_of_a_row_tile_the_step(pp4):
    """Passes, communication outside them and idle time cover each row without overlap
    (folded ranks never wait inside a pass)."""
    _, _, times, _, payload = pp4
    spec = payload["binned"][0]
    step_ns = round(times.step_time_s * 1e9)
    for row in range(4):
        pieces = sorted(iv for trace in spec["traces"]
                        for iv in zip(*decode_row(trace["rows"][row])))
        covered = sum(e - s for s, e in pieces)
        assert covered == pytest.approx(step_ns, abs=len(pieces))  # 1 ns rounding per piece
        assert all(a[1] <= b[0] + 1 for a, b in zip(pieces, pieces[1:]))


def test_shapes_do_not_grow_with_micro_batches():
    """Beyond the pipeline view's own hover points and micro-batch labels; the labels never
    overlap, so a row holds at most NOMINAL_PLOT_PX / (10 px + 2 px gap) of them."""
    counts, passes, labels = [], [], []
    for m in (8, 32):
        exp = experiment(PP4_M8, global_batch=m)
        payload = read_payload(render_report(exp, *predict(exp)))
        figure = payload["figures"]["parasim-pipeline"]
        labels.append(len(next(t for t in figure["data"]
                               if (t.get("meta") or {}).get("labels"))["x"]))
        counts.append(drawn_shapes(payload))
        counts[-1]["parasim-pipeline"] -= labels[-1]
        passes.append(len(pass_points(figure)))
    assert counts[0] == counts[1]
    assert sum(counts[0].values()) < 300
    assert passes == [4 * (2 * 8 + 1), 4 * (2 * 32 + 1)]  # the pipeline view's own
    assert 0 < labels[0] < labels[1] <= 4 * NOMINAL_PLOT_PX // 12


# --- lanes ---------------------------------------------------------------------------------

def test_no_communication_shape_spans_more_than_its_op(small):
    exp, summary, times = small
    payload = read_payload(render_report(exp, summary, times))
    spec = next(s for s in payload["binned"] if s["div"] == "parasim-lanes")
    figure = payload["figures"]["parasim-lanes"]
    names = [trace["meta"] for trace in figure["data"]]
    assert names[0] == "pp 0 r0 · compute" and any(n.endswith("compute/tp") for n in names)
    for trace in spec["traces"]:
        rank, lane = re.match(r"pp \d+ r(\d+) · (.+)", names[trace["index"]]).groups()
        rank = int(rank)
        ops = [(round(s * 1e9), round(e * 1e9)) for op, s, e in
               zip(times.plan.ops[rank], times.starts[rank], times.ends[rank])
               if lane_name(op) == lane]
        starts, ends = decode_row(trace["rows"][0])
        if lane == "compute":  # kernels that touch joined: the same busy time, no gap inside
            assert np.sum(ends - starts) == sum(e - s for s, e in ops)
            assert len(starts) <= len(ops)
        else:  # one interval per op, exactly its own time
            assert list(zip(starts, ends)) == ops
        z = binned_z(trace["rows"][0], 0, times.step_time_s)
        assert np.all(z <= 1 + 1e-9) and np.all(z >= -1e-12)


def test_lanes_default_to_the_first_and_last_stage_and_follow_the_user(small, tmp_path):
    exp, summary, times = small
    default = read_payload(render_report(exp, summary, times))["figures"]["parasim-lanes"]
    assert {t["meta"].split(" · ")[0] for t in default["data"]} == {"pp 0 r0", "pp 1 r4"}
    page = render_report(exp, summary, times, ranks=[5])  # folded onto rank 4
    chosen = read_payload(page)["figures"]["parasim-lanes"]
    assert {t["meta"].split(" · ")[0] for t in chosen["data"]} == {"pp 1 r4"}
    assert "rank 5 is shown by rank 4, which stands for it" in page
    with pytest.raises(ConfigError, match="rank 8 is not in the simulated plan"):
        write_report(tmp_path / "step.html", exp, summary, times, ranks=[8])
    assert list(tmp_path.iterdir()) == []


def test_unfolded_plan_draws_the_lowest_rank_of_each_stage(small):
    exp, _, _ = small
    summary, times = predict(exp, fold=False)
    payload = read_payload(render_report(exp, summary, times, ranks=[5]))
    ticks = payload["figures"]["parasim-pipeline"]["layout"]["yaxis"]["ticktext"]
    assert ticks == ["pp 0 · r0", "pp 1 · r4"]  # not folded: no device count
    lanes = {t["meta"] for t in payload["figures"]["parasim-lanes"]["data"]}
    assert lanes == {"pp 1 r5 · compute", "pp 1 r5 · compute/tp", "pp 1 r5 · recv_prev",
                     "pp 1 r5 · send_prev", "pp 1 r5 · dp"}


# --- where the time goes -------------------------------------------------------------------

def test_the_waterfall_adds_up_to_mfu(small):
    exp, summary, times = small
    w = waterfall(exp, summary, [rank_ops(times, r) for r in times.plan.ranks])
    assert sum(v for _, v in w.steps()) + w.mfu == pytest.approx(1.0, abs=1e-12)
    assert w.mfu == pytest.approx(summary.mfu, rel=1e-12)
    assert w.idle == pytest.approx(summary.bubble_fraction, rel=1e-12)
    assert w.recompute > 0  # full recomputation re-runs every layer's forward


def test_collective_table_accounts_for_every_call_within_the_links(small):
    exp, summary, times = small
    rows = collective_rows(times, CommIndex(exp, times),
                           {r: rank_ops(times, r) for r in times.plan.ranks})
    sends = [(op, e - s) for r in times.plan.ranks
             for op, s, e in zip(times.plan.ops[r], times.starts[r], times.ends[r])
             if op.kind not in (OpKind.COMPUTE, OpKind.RECV)]
    assert sum(r.calls for r in rows) == len(sends)
    assert sum(r.time_s for r in rows) == pytest.approx(sum(d for _, d in sends), rel=1e-12)
    assert {r.carries for r in rows} >= {"tp", "grads", "p2p act", "p2p grad"}
    for row in rows:  # no prediction beyond what the links carry
        assert 0 < row.busbw_Bps <= row.peak_busbw_Bps * (1 + 1e-9)
        assert "/" in row.algo or row.algo == "p2p"  # NCCL's choice, e.g. ring/LL128


# --- memory and words ----------------------------------------------------------------------

def test_memory_peaks_are_the_memory_model(pp4):
    _, summary, _, page, payload = pp4
    fig = payload["figures"]["parasim-memory-time"]
    peaks = next(t for t in fig["data"] if t.get("name") == "peak")
    # ~1 MiB peaks: drawn in MiB (`MemoryScale`), the 80 GiB GPU named, not drawn
    assert fig["layout"]["yaxis"]["title"]["text"] == "MiB"
    assert np.allclose(typed(peaks["y"]),
                       [m.total_bytes / 2**20 for m in summary.memory_by_pp_rank], rtol=1e-12)
    capacity = fig["layout"]["annotations"][0]["text"]
    assert capacity == (f"GPU memory {summary.memory_capacity_bytes / GiB:.1f} GiB: off the "
                        "scale, not drawn")


def test_words_follow_the_cluster_and_the_folding(pp4):
    _, _, _, page, payload = pp4
    ticks = payload["figures"]["parasim-pipeline"]["layout"]["yaxis"]["ticktext"]
    assert ticks == ["pp 0 · r0 · 2 GPUs", "pp 1 · r2 · 2 GPUs", "pp 2 · r4 · 2 GPUs",
                     "pp 3 · r6 · 2 GPUs"]
    assert "(8 GPUs, H100" in page and "stands for the 2 GPUs of its pipeline stage" in page
    torus = experiment({"model": PP4_M8["model"],
                        "parallel": {"tp": 4, "pp": 1, "dp": 16, "global_batch": 32},
                        "cluster": {"preset": "tpu-v4", "dims": [4, 4, 4]}})
    page = render_report(torus, *predict(torus))
    text = page[:page.index("<script")]  # the page's words, before the (base64) scripts
    assert "(64 chips," in text and "stands for the 64 chips" in text and "GPU" not in text
    assert re.search(r"model [TGM]FLOP/s/chip", text)  # the unit fits the rate (issue 22)
    payload = read_payload(page)
    assert "GPU" not in json.dumps(payload)
    assert payload["figures"]["parasim-memory"]["layout"]["annotations"][0]["text"] \
        .startswith("chip memory")


# --- atomic writes -------------------------------------------------------------------------

def test_failed_rendering_leaves_nothing(tmp_path, monkeypatch, pp4):
    exp, summary, times, _, _ = pp4

    def boom(*args, **kwargs):
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(page_module.pio, "to_json", boom)
    with pytest.raises(RuntimeError, match="rendering failed"):
        write_report(tmp_path / "step.html", exp, summary, times)
    assert list(tmp_path.iterdir()) == []


def test_failed_rename_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch, pp4):
    exp, summary, times, _, _ = pp4
    path = tmp_path / "step.html"
    path.write_text("old report")

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("traces.files.os.replace", no_rename)
    with pytest.raises(ConfigError, match="cannot write: No space left on device"):
        write_report(path, exp, summary, times)
    assert list(tmp_path.iterdir()) == [path] and path.read_text() == "old report"


def test_missing_directory_is_a_user_error(tmp_path, pp4):
    exp, summary, times, _, _ = pp4
    with pytest.raises(ConfigError, match="cannot write"):
        write_report(tmp_path / "nope" / "step.html", exp, summary, times)


# --- the command line --------------------------------------------------------------------------

SMALL_TOML = """
[model]
layers = 4
hidden = 64
heads = 4
seq_len = 32
vocab = 128

[parallel]
tp = 2
pp = 2
dp = 2
global_batch = 8

[cluster]
preset = "dgx-h100"
nodes = 1
"""


def test_cli_writes_gzipped_perfetto_with_memory_and_chosen_report_ranks(tmp_path, capsys):
    from sim.cli import main

    config = tmp_path / "small.toml"
    config.write_text(SMALL_TOML)
    chrome, report = tmp_path / "step.json.gz", tmp_path / "step.html"
    assert main(["simulate", str(config), "--chrome", str(chrome), "--report", str(report),
                 "--report-ranks", "7"]) == 0
    document = json.loads(gzip.decompress(chrome.read_bytes()))
    counters = [e for e in document["traceEvents"] if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {0, 4}
    names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"]
             if e["name"] == "process_name"}
    assert names[4] == "pp 1 · rank 4 (stands for 4 GPUs: tp 2 × dp 2)"
    assert sum(e["ph"] == "s" for e in document["traceEvents"]) == 2 * 4  # act + grad per mb
    page = report.read_text(encoding="utf-8")
    assert "rank 7 is shown by rank 4, which stands for it" in page
    capsys.readouterr()


@pytest.mark.parametrize("ranks", ["a,b", "-1", ""])
def test_cli_refuses_bad_report_ranks_before_simulating(tmp_path, capsys, ranks):
    from sim.cli import main

    config = tmp_path / "small.toml"
    config.write_text(SMALL_TOML)
    assert main(["simulate", str(config), "--report", str(tmp_path / "r.html"),
                 "--report-ranks", ranks]) == 2
    err = capsys.readouterr().err
    assert err.startswith("parasim: error: --report-ranks:") and len(err.splitlines()) == 1
    assert not (tmp_path / "r.html").exists()
