"""Issue 22, item 21: the reports' units fit the size, labels follow the run, the hint's ranks
exist, the validate page's classes, tables and receive lanes, the search page's extent and
labels, and the memory curves of a deep pipeline.

    pytest tests/sim/report/test_report_friendly.py -q
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sim.config import load_experiment
from sim.metrics import gemm_precision
from sim.report.memory_view import MAX_LINES, memory_over_time_figure, shown_pp_ranks
from sim.report.page import detail_ranks, hint_ranks
from sim.report.timeline import present_pp_ranks
from sim.report.validation import class_marker, transfer_starts
from sim.report.words import Words, words_for
from sim.simulate import headline, predict, rate_unit, rate_value, size_text
from traces.ops import Op, OpKind, Stream, Trace

EXAMPLES = Path(__file__).parents[3] / "sim" / "examples"


@pytest.fixture(scope="module")
def tiny():
    exp = load_experiment(EXAMPLES / "gpt-tiny-localhost.toml")
    summary, times = predict(exp)
    return exp, summary, times


@pytest.mark.parametrize(("tflops", "unit", "value"), [
    (124.4, "TFLOP/s", "124.4"), (1.0, "TFLOP/s", "1.0"), (0.0135, "GFLOP/s", "13.5"),
    (0.001, "GFLOP/s", "1.0"), (2.5e-5, "MFLOP/s", "25.0"), (0.0, "MFLOP/s", "0.0")])
def test_a_rate_takes_the_largest_unit_it_is_one_or_more_of(tflops, unit, value):
    assert (rate_unit(tflops), rate_value(tflops)) == (unit, value)


@pytest.mark.parametrize(("nbytes", "text"), [
    (26.8 * 2**30, "26.8 GiB"), (2**30, "1.0 GiB"), (6.0 * 2**20, "6.0 MiB"),
    (2**30 - 2**20, "1023.0 MiB"), (512, "0.5 KiB")])
def test_a_size_takes_gib_from_one_gib_up(nbytes, text):
    assert size_text(nbytes) == text


def test_the_tiny_example_says_gflops_and_mib_not_zeros(tiny):
    exp, summary, _ = tiny
    rows = dict(headline(summary))
    assert f"{summary.model_tflops_per_gpu * 1e3:.1f}" == rows["model GFLOP/s/GPU"].split()[0]
    assert rows["model GFLOP/s/GPU"].split()[0] != "0.0"
    assert rows["peak memory"].startswith(f"{summary.peak_memory_bytes / 2**20:.1f} MiB of ")
    assert gemm_precision(exp.model) == "fp32"


def test_the_waterfall_names_the_precision_of_its_peak(tiny):
    exp = tiny[0]
    fp8 = dataclasses.replace(exp.model, dtype="fp8")
    bf16 = dataclasses.replace(exp.model, dtype="bf16")
    assert (gemm_precision(fp8), gemm_precision(bf16)) == ("fp8", "bf16")
    from sim.report.breakdown import waterfall, waterfall_figure
    from sim.report.timeline import rank_ops
    _, summary, times = tiny
    cols = [rank_ops(times, r) for r in times.plan.ranks]
    fig = waterfall_figure(waterfall(exp, summary, cols), words_for(exp, times), "fp32")
    assert fig.data[0].x[0].endswith("dense fp32)")


def test_the_hint_names_ranks_the_report_accepts(tiny):
    _, _, times = tiny
    shown, _ = detail_ranks(times, present_pp_ranks(times), None)
    hint = hint_ranks(times, shown)
    assert hint == [1, 3]  # 4 ranks, 0 and 2 drawn already (the old hint said 0,64)
    detail_ranks(times, present_pp_ranks(times), hint)  # raises for a rank not there


def test_37_op_classes_get_37_distinct_markers():
    markers = [class_marker(i) for i in range(37)]
    assert len(set(markers)) == 37


def _op(kind, stream, start, end, peer, tag="act"):
    return Op(kind=kind, name="", stream=stream, start=start, end=end, peer=peer, tag=tag,
              size_bytes=1024)


def test_a_receive_is_drawn_from_when_its_send_is_posted():
    """Measured: rank 1 posts its receive at 0 and waits; rank 0 sends at 5 ms, the data
    arrives at 6 ms. The lane shows 5..6 ms, as the simulated receive would."""
    send = _op(OpKind.SEND, Stream.SEND_NEXT, 5e-3, 6e-3, peer=1)
    recv = _op(OpKind.RECV, Stream.RECV_PREV, 0.0, 6e-3, peer=0)
    early = _op(OpKind.SEND, Stream.SEND_NEXT, 7e-3, 8e-3, peer=1, tag="grad")
    late = _op(OpKind.RECV, Stream.RECV_PREV, 7.5e-3, 8e-3, peer=0, tag="grad")
    trace = Trace({0: (send, early), 1: (recv, late)})
    assert transfer_starts(trace) == {(1, 0): 5e-3, (1, 1): 7.5e-3}


def test_a_deep_pipeline_draws_a_few_representative_curves():
    curves = {pp: [(0.0, 1.0), (1.0, 10.0 + (5.0 if pp == 3 else -pp * 0.1))]
              for pp in range(16)}
    shown = shown_pp_ranks(curves)
    assert shown == [0, 3, 8, 15] and len(shown) <= MAX_LINES
    assert shown_pp_ranks({0: [(0, 1)], 1: [(0, 2)]}) == [0, 1]
    words = Words(device="GPU", devices="GPUs", stands_for=1, fold="", layout=None)
    fig = memory_over_time_figure(curves, 2**34, words, 1.0)
    drawn = [t.name for t in fig.data if t.mode == "lines" and t.visible != "legendonly"]
    assert drawn == ["pp 0", "pp 3", "pp 8", "pp 15"]
    assert len([t for t in fig.data if t.visible == "legendonly"]) == 12
