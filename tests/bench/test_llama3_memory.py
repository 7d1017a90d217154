"""Llama 3 Table 4's rows trained at 8K without activation checkpointing (§3.3.2): rank 1's
peak, the busiest, equals the hand count of docs/recipes.md ("Llama 3's memory") term by
term, and fits an H100's 81,559 MiB."""

from __future__ import annotations

import pytest
from recipes_rows import LLAMA3_ROWS

from sim.config import experiment_from_dict
from sim.models.memory import memory_by_pp_rank

H, F, KV, T, PP, VP = 16384, 53248, 8 * 128, 8, 16, 8
LAYER = (H * (H + 2 * KV) + H * H + H * 2 * F + F * H) / T + 2 * H
"""One layer's parameters on a TP rank: QKV (GQA), proj, SwiGLU's gate and up, fc2; the two
RMSNorm weights whole."""
PER_LAYER = 31.75 * 8192 * H / T
"""Stored activations of one layer and micro-batch of 8,192 tokens on a rank (CP 16: 131,072
/ 16): norm inputs 4, qkv and fc1 inputs 4, Q 2, K and V 2·2·8/128, attention output 2,
gate and up 4f/h, fc2 input 2f/h, bytes per s·b·h/t."""


@pytest.mark.parametrize(("row", "in_flight"), [
    (LLAMA3_ROWS[0], 2 * (PP - 1 - 1) + (VP - 1) * PP + 1),  # M = 32: Megatron's warm-up + 1
    (LLAMA3_ROWS[1], 16 * VP),  # M = pp = 16: every forward first
    (LLAMA3_ROWS[2], 16 * VP),
], ids=lambda x: getattr(x, "name", str(x)))
def test_rank_1_is_the_hand_count_and_fits(row, in_flight):
    exp = experiment_from_dict(row.config(), name=row.name)
    mem = memory_by_pp_rank(exp.model, exp.layout)[1]
    params, shards = 8 * LAYER, row.parallel["dp"] * row.parallel["cp"]
    assert mem.params_bytes == pytest.approx(2 * params, rel=1e-12)
    assert mem.grads_bytes == pytest.approx(4 * params / shards, rel=1e-12)  # fp32 shards
    assert mem.optimizer_bytes == pytest.approx(12 * params / shards, rel=1e-12)
    assert mem.activations_bytes == pytest.approx(in_flight * PER_LAYER, rel=1e-12)
    assert mem.working_bytes == pytest.approx(4 * LAYER, rel=1e-12)  # a layer's fp32 bucket
    assert mem.total_bytes <= exp.cluster.accelerator.memory_bytes == 81559 * 2**20
