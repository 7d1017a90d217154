"""Memory charts in the unit the text writes the largest peak in, the device's capacity drawn
beside the peaks only where it does not flatten them (the tiny GPT's 6 MiB on a 3 GiB CPU rank
was a flat line at 0 on a GiB axis), in the step report and the sweep page alike."""

from __future__ import annotations

import pytest

from sim.config import example_path, load_experiment
from sim.report.memory_scale import CAPACITY_SPAN, MemoryScale
from sim.report.memory_view import memory_by_pp_rank_figure, memory_over_time_figure
from sim.report.words import Words
from sim.simulate import predict

GiB, MiB = 2**30, 2**20
WORDS = Words(device="GPU", devices="GPUs", stands_for=1, fold="", layout=None)


@pytest.mark.parametrize(("peak", "capacity", "unit", "drawn"), [
    (6 * MiB, 3 * GiB, "MiB", False),           # the tiny GPT on a CPU rank: 512x
    (62.1 * GiB, 79.6 * GiB, "GiB", True),      # Llama 3 70B on an H100
    (7 * GiB, 80 * GiB, "GiB", True),           # 11x: the headroom is worth seeing
    (80 * GiB / (CAPACITY_SPAN + 1), 80 * GiB, "GiB", False),
    (900 * 2**10, 80 * GiB, "KiB", False),
    (100 * GiB, 80 * GiB, "GiB", True),         # does not fit: the line under the peak
])
def test_the_unit_is_the_peaks_and_a_far_capacity_is_only_named(peak, capacity, unit, drawn):
    scale = MemoryScale.of(peak, capacity)
    assert (scale.unit, scale.capacity_drawn) == (unit, drawn)
    assert scale.size == {"GiB": GiB, "MiB": MiB, "KiB": 1024}[unit]


def test_a_gib_step_draws_the_capacity_line_in_gib():
    curves = {0: [(0.0, 40 * GiB), (1.0, 60 * GiB)], 1: [(0.0, 30 * GiB), (1.0, 50 * GiB)]}
    fig = memory_over_time_figure(curves, 80 * GiB, WORDS, 1.0)
    assert fig.layout.yaxis.title.text == "GiB"
    assert [list(t.y) for t in fig.data[:2]] == [[40.0, 60.0], [30.0, 50.0]]
    assert [s.y0 for s in fig.layout.shapes] == [80.0]
    assert fig.layout.annotations[0].text == "GPU memory 80.0 GiB"


def test_the_tiny_gpts_memory_is_drawn_in_mib_without_the_3_gib_line():
    exp = load_experiment(example_path("gpt-tiny-localhost.toml"))
    summary, _ = predict(exp)
    fig = memory_by_pp_rank_figure(summary, WORDS).to_plotly_json()
    assert fig["layout"]["yaxis"]["title"]["text"] == "MiB"
    stacked = [sum(t["y"][i] for t in fig["data"]) for i in range(len(fig["data"][0]["y"]))]
    assert stacked == pytest.approx([m.total_bytes / MiB for m in summary.memory_by_pp_rank],
                                    rel=1e-12)
    assert 1 < max(stacked) < 1024  # a few MiB, as the text says "6.0 MiB"
    assert "shapes" not in fig["layout"] or not fig["layout"]["shapes"]
    assert fig["layout"]["annotations"][0]["text"] == (
        f"GPU memory {summary.memory_capacity_bytes / GiB:.1f} GiB: off the scale, not drawn")
