"""Stored activations where a rank's chunks differ (Megatron-Core's account flags and pipeline
layouts, `traces.stage_split`): each micro-batch in flight holds its own chunk's layers, not the
rank's average chunk."""

from __future__ import annotations

import dataclasses

import pytest

from sim.models.memory import (
    activation_bytes_per_layer,
    memory_by_pp_rank,
    memory_timeline,
    pp_rank_memory,
)
from traces.layout import Layout
from traces.model import ModelSpec
from traces.pipeline import build_schedule

SIX = ModelSpec(layers=6, hidden=64, heads=4, seq_len=32, vocab=128)
BOTH = Layout(pp=2, vp=2, schedule="interleaved", global_batch=4, account_for_embedding=True,
              account_for_loss=True)


def test_each_micro_batch_in_flight_holds_its_own_chunks_layers():
    """6 + E + L over PP 2 x VP 2: stages of 1, 2, 2, 1 layers; rank 0 holds stages 0 (1) and
    2 (2), rank 1 stages 1 (2) and 3 (1). Interleaved 1F1B with 4 micro-batches runs, on rank 0,
    0F0 0F1 2F0 2F1 0F2 2B0 ...: 1 + 1 + 2 + 2 + 1 = 7 layers in flight at its peak (5 passes:
    the average chunk would say 7.5); on rank 1, 1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 ...: after 1F2,
    2 + 2 + 2 = 6 (3 passes: the average would say 4.5)."""
    schedule = build_schedule("interleaved", 2, 4, 2)
    assert [f"{a.stage}{a.kind}{a.microbatch}" for a in schedule[0][:6]] == \
        ["0F0", "0F1", "2F0", "2F1", "0F2", "2B0"]
    assert [f"{a.stage}{a.kind}{a.microbatch}" for a in schedule[1][:8]] == \
        ["1F0", "1F1", "3F0", "3B0", "3F1", "3B1", "1F2", "1B0"]
    assert BOTH.stage_layers(SIX) == (1, 2, 2, 1)
    per_layer = activation_bytes_per_layer(SIX, BOTH)
    memory = memory_by_pp_rank(SIX, BOTH)
    assert memory[0].activations_bytes == 7 * per_layer
    assert memory[1].activations_bytes == 6 * per_layer


def test_the_timelines_peak_is_the_peak_of_the_breakdown():
    schedule = build_schedule("interleaved", 2, 4, 2)
    for r in range(2):
        timed = [(a, float(i), i + 0.5) for i, a in enumerate(schedule[r])]
        curve = memory_timeline(SIX, BOTH, r, timed)
        assert max(b for _, b in curve) == pytest.approx(
            pp_rank_memory(SIX, BOTH, r, schedule[r]).total_bytes, rel=1e-12)
        assert curve[-1][1] == pytest.approx(curve[0][1], rel=1e-12)  # all freed at the end


def test_equal_chunks_keep_the_even_accounting():
    """1F1B (one chunk a rank) with both flags: 6 + 2 = 8 over PP 2, 3 layers a rank; the same
    bytes as pp_first_layers = pp_last_layers = 3."""
    flags = Layout(pp=2, global_batch=4, account_for_embedding=True, account_for_loss=True)
    uneven = Layout(pp=2, global_batch=4, pp_first_layers=3, pp_last_layers=3)
    assert memory_by_pp_rank(SIX, flags) == memory_by_pp_rank(SIX, uneven)
    # a layout string stating the even split is the even split
    eight = dataclasses.replace(SIX, layers=8)
    even = Layout(pp=2, vp=2, schedule="interleaved", global_batch=4)
    stated = dataclasses.replace(even, pipeline_layout="Ett|tt|tt|ttL")
    assert memory_by_pp_rank(eight, stated) == memory_by_pp_rank(eight, even)
