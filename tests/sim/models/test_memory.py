"""Memory model: the ZeRO paper's figures, Korthikanti's activation formulas, schedule peaks."""

import dataclasses
import subprocess
import sys

import pytest

from sim.models.memory import (
    MemoryBreakdown,
    activation_bytes_per_layer,
    memory_by_pp_rank,
    model_state_bytes,
    peak_in_flight,
    pp_rank_memory,
)
from traces.errors import ConfigError
from traces.layout import Layout, Recompute, Schedule
from traces.model import ModelSpec
from traces.pipeline import Action, build_schedule

GPT3 = ModelSpec(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200)
UNFUSED = dataclasses.replace(GPT3, attention="unfused")  # materialized a·s² scores
S, B, H, A = 2048, 1, 12288, 96

# A model small enough to add up by hand: layer_params(2) = (4*64*64 + 3*64 + 2*64*256 + 256)/2
# + 6*64 = 49600/2 + 384 = 25184.
SMALL = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128)


def gpt3_layout(**options) -> Layout:
    return Layout(tp=8, pp=16, dp=8, global_batch=1536, **options)


# --- model states: Rajbhandari et al. 2020, Fig. 1 ------------------------------------------------

@pytest.mark.parametrize(("zero", "expected"), [
    (0, 120e9),            # 16 * 7.5e9
    (1, 31.40625e9),       # 4 * 7.5e9 + 12 * 7.5e9 / 64
    (2, 16.640625e9),      # 2 * 7.5e9 + 14 * 7.5e9 / 64
    (3, 1.875e9),          # 16 * 7.5e9 / 64
])
def test_zero_paper_figures(zero, expected):
    assert sum(model_state_bytes(7.5e9, 64, zero)) == expected


def test_zero_stages_shard_what_they_say():
    p, n = 1e9, 4
    assert model_state_bytes(p, n, 0) == (2e9, 2e9, 12e9)
    assert model_state_bytes(p, n, 1) == (2e9, 2e9, 3e9)
    assert model_state_bytes(p, n, 2) == (2e9, 0.5e9, 3e9)
    assert model_state_bytes(p, n, 3) == (0.5e9, 0.5e9, 3e9)


def test_unknown_zero_stage_is_a_config_error():
    with pytest.raises(ConfigError, match="zero"):
        model_state_bytes(1e9, 8, 4)


# --- activations per layer: Korthikanti et al. 2022, Table 2 ------------------------------------

def test_no_tp_is_34sbh_plus_5as2b():
    layout = Layout(tp=1)
    assert activation_bytes_per_layer(UNFUSED, layout) == 34 * S * B * H + 5 * A * S * S * B


def test_tp_without_sp_replicates_10sbh():
    layout = gpt3_layout()
    expected = S * B * H * (10 + 24 / 8 + 5 * A * S / (H * 8))
    assert activation_bytes_per_layer(UNFUSED, layout) == pytest.approx(expected, rel=1e-12)


def test_tp_with_sp_is_exactly_one_tp_th_of_no_tp():
    no_tp = activation_bytes_per_layer(UNFUSED, Layout(tp=1))
    with_sp = activation_bytes_per_layer(UNFUSED, gpt3_layout(sp=True))
    assert with_sp == pytest.approx(no_tp / 8, rel=1e-12)
    assert with_sp == pytest.approx((34 * S * B * H + 5 * A * S * S * B) / 8, rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
def test_flash_drops_the_attention_scores(sp):
    flash = activation_bytes_per_layer(GPT3, gpt3_layout(sp=sp))
    plain = activation_bytes_per_layer(UNFUSED, gpt3_layout(sp=sp))
    expected = S * B * H * (34 / 8 if sp else 10 + 24 / 8)
    assert flash == pytest.approx(expected, rel=1e-12)
    assert plain - flash == pytest.approx(5 * A * S * S * B / 8, rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
def test_selective_recompute_equals_flash(sp):
    selective = gpt3_layout(sp=sp, recompute=Recompute.SELECTIVE)
    flash = gpt3_layout(sp=sp)
    assert activation_bytes_per_layer(UNFUSED, selective) == \
        activation_bytes_per_layer(GPT3, flash)


@pytest.mark.parametrize(("sp", "expected"), [(False, 2 * S * B * H), (True, 2 * S * B * H / 8)])
def test_full_recompute_keeps_the_layer_input(sp, expected):
    layout = gpt3_layout(sp=sp, recompute=Recompute.FULL)
    assert activation_bytes_per_layer(UNFUSED, layout) == expected


def test_activations_scale_with_micro_batch():
    one = activation_bytes_per_layer(UNFUSED, gpt3_layout(micro_batch=1))
    four = activation_bytes_per_layer(UNFUSED, gpt3_layout(micro_batch=4))
    assert four == pytest.approx(4 * one, rel=1e-12)


# --- in-flight micro-batches from the real schedules --------------------------------------------

@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 4), (4, 2), (8, 3), (1, 5)])
def test_one_f_one_b_holds_pp_minus_rank(pp, m):
    schedule = build_schedule("1f1b", pp, m)
    assert [peak_in_flight(schedule[r]) for r in range(pp)] == [min(pp - r, m) for r in range(pp)]


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (2, 3)])
def test_gpipe_holds_every_micro_batch(pp, m):
    schedule = build_schedule("gpipe", pp, m)
    assert [peak_in_flight(schedule[r]) for r in range(pp)] == [m] * pp


def test_interleaved_first_rank_holds_more_chunks_than_last():
    pp, vp, m = 4, 2, 8
    schedule = build_schedule("interleaved", pp, m, vp)
    peaks = [peak_in_flight(schedule[r]) for r in range(pp)]
    assert peaks[0] > peaks[pp - 1]
    # Megatron's warm-up 2(pp - r - 1) + (vp - 1)pp forwards, then one more before the first B.
    assert peaks == [2 * (pp - r - 1) + (vp - 1) * pp + 1 for r in range(pp)]


def test_peak_counts_forwards_not_yet_backwarded():
    actions = [Action.parse(a) for a in ("0F0", "0F1", "0B0", "0F2", "0F3", "0B1", "0B2", "0B3")]
    assert peak_in_flight(actions) == 3
    assert peak_in_flight([]) == 0


def test_backward_before_its_forward_is_an_error():
    with pytest.raises(ConfigError, match="0B1"):
        peak_in_flight([Action.parse("0F0"), Action.parse("0B1")])


# --- whole stages, added up by hand -------------------------------------------------------------

def small_layout(**options) -> Layout:
    # m = 8 / (1 * 2) = 4 micro-batches.
    return Layout(tp=2, pp=2, dp=2, global_batch=8, **options)


def test_small_stages_by_hand():
    first, last = memory_by_pp_rank(SMALL, small_layout(zero=1))
    # Rank 0: 2 layers * 25184 + embedding 128*64/2 + 32*64 = 50368 + 6144 = 56512 parameters.
    assert first.params_bytes == 2 * 56512
    assert first.grads_bytes == 2 * 56512
    assert first.optimizer_bytes == 12 * 56512 / 2  # ZeRO-1 over dp = 2: 339072
    # 32*1*64 * (10 + 24/2) = 45056 per layer (flash on), 2 in flight * 2 layers.
    assert first.activations_bytes == 2 * 2 * 45056
    assert first.working_bytes == 0
    assert first.total_bytes == 113024 + 113024 + 339072 + 180224
    # Rank 1: 2 layers + head 2*64 + 128*64/2 = 50368 + 4224 = 54592 parameters.
    assert (last.params_bytes, last.grads_bytes) == (2 * 54592, 2 * 54592)
    assert last.optimizer_bytes == 12 * 54592 / 2
    assert last.activations_bytes == 1 * 2 * 45056
    assert last.working_bytes == 4 * 32 * 1 * 128 / 2  # fp32 logits: 8192
    assert last.total_bytes == 109184 + 109184 + 327552 + 90112 + 8192


def test_small_stage_with_zero3_full_recompute_and_sp():
    layout = small_layout(zero=3, recompute=Recompute.FULL, sp=True)
    first, last = memory_by_pp_rank(dataclasses.replace(SMALL, attention="unfused"), layout)
    s, b, h, a, t, v = 32, 1, 64, 4, 2, 128
    assert first.params_bytes == 2 * 56512 / 2
    assert first.grads_bytes == 2 * 56512 / 2
    assert first.optimizer_bytes == 12 * 56512 / 2
    assert first.activations_bytes == 2 * 2 * (2 * s * b * h / t)  # 2 in flight, 2 layers
    recomputed = s * b * h * (34 + 5 * a * s / h) / t  # one layer as if not recomputed
    gathered = 2 * 2 * 25184 + 2 * 25184  # two layers' weights + one layer's grads, 2 bytes
    assert first.working_bytes == recomputed + gathered
    assert last.working_bytes == recomputed + gathered + 4 * s * b * v / t


def test_parameters_add_up_to_the_model_plus_the_tied_copy():
    layout = Layout(pp=4, global_batch=4)
    params = sum(stage.params_bytes for stage in memory_by_pp_rank(SMALL, layout)) / 2
    copy = SMALL.vocab * SMALL.hidden  # the last stage's copy of the tied word embeddings
    assert params == SMALL.num_params() + copy


def test_interleaved_stage_holds_its_chunks_layers():
    model = ModelSpec(layers=8, hidden=64, heads=4, seq_len=32, vocab=128)
    layout = Layout(pp=2, vp=2, global_batch=2, schedule=Schedule.INTERLEAVED)
    first, last = memory_by_pp_rank(model, layout)
    # Rank 0 runs stages 0 and 2 (layers 0-1 and 4-5) plus the embedding; rank 1 the head.
    assert first.params_bytes == 2 * (4 * model.layer_params() + model.embedding_params())
    assert last.params_bytes == 2 * (4 * model.layer_params() + model.head_params())
    # m == pp = 2: all 2 chunks * 2 micro-batches warm up before any backward, 2 layers each.
    per_layer = activation_bytes_per_layer(model, layout)
    assert first.activations_bytes == 4 * 2 * per_layer


# --- memory_by_pp_rank --------------------------------------------------------------------------

def test_memory_by_pp_rank_gpt3_one_f_one_b():
    layout = gpt3_layout(sp=True, recompute=Recompute.SELECTIVE, zero=1)
    stages = memory_by_pp_rank(GPT3, layout)
    assert len(stages) == 16
    activations = [stage.activations_bytes for stage in stages]
    assert activations[0] == max(activations)
    assert activations == sorted(activations, reverse=True)
    # Rank 0 holds pp = 16 micro-batches of 96/16 = 6 layers, 34sbh/8 each.
    assert activations[0] == pytest.approx(16 * 6 * 34 * S * B * H / 8, rel=1e-12)


def test_memory_by_pp_rank_gpipe_holds_all_micro_batches_everywhere():
    layout = Layout(pp=2, dp=1, global_batch=6, schedule=Schedule.GPIPE)
    stages = memory_by_pp_rank(SMALL, layout)
    per_layer = activation_bytes_per_layer(SMALL, layout)
    assert [s.activations_bytes for s in stages] == [6 * 2 * per_layer] * 2


def test_pp_rank_memory_matches_memory_by_pp_rank():
    layout = small_layout(zero=2)
    schedule = build_schedule("1f1b", 2, 4)
    assert [pp_rank_memory(SMALL, layout, r, schedule[r]) for r in range(2)] == \
        memory_by_pp_rank(SMALL, layout)


def test_total_is_the_sum_of_the_parts():
    part = MemoryBreakdown(params_bytes=1, grads_bytes=2, optimizer_bytes=4,
                           activations_bytes=8, working_bytes=16)
    assert part.total_bytes == 31


def test_memory_model_does_not_import_torch():
    code = "import sys, sim.models.memory; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- context parallelism and uneven stages ----------------------------------------------------

def test_cp_activations_are_a_hand_count_on_s_over_cp_tokens():
    # SMALL with flash attention, no TP: 34·s·b·h on the rank's s/cp = 32/2 = 16 tokens
    # (2 of the 4 chunks), 34 * 16 * 1 * 64 = 34,816 bytes; with TP 2 and SP, a half of it.
    assert activation_bytes_per_layer(SMALL, Layout(cp=2)) == 34 * 16 * 1 * 64 == 34_816
    assert activation_bytes_per_layer(SMALL, Layout(cp=2, tp=2, sp=True)) == 17_408
    for cp in (2, 4, 8):  # cp divides it exactly (flash: no s² term left)
        for options in ({}, {"tp": 2, "sp": True}, {"recompute": "full"}):
            assert activation_bytes_per_layer(SMALL, Layout(cp=cp, **options)) * cp == \
                activation_bytes_per_layer(SMALL, Layout(**options))


def test_cp_shards_zero_over_dp_times_cp_and_the_logits_over_cp():
    cp2 = pp_rank_memory(SMALL, Layout(cp=2, dp=2, zero=1, global_batch=2), 0,
                         [Action(0, "F", 0)])
    dp4 = pp_rank_memory(SMALL, Layout(dp=4, zero=1, global_batch=4), 0, [Action(0, "F", 0)])
    assert cp2.optimizer_bytes == dp4.optimizer_bytes  # 12Ψ / (dp·cp)
    # the fp32 logits of the rank's tokens: 4 · (32/2) · 1 · 128 bytes
    assert cp2.working_bytes == 4 * 16 * 128


def test_uneven_stages_hold_their_own_layers():
    model = dataclasses.replace(SMALL, layers=10)
    layout = Layout(pp=4, dp=1, global_batch=4, pp_first_layers=1, pp_last_layers=1)
    memory = memory_by_pp_rank(model, layout)
    per_layer = activation_bytes_per_layer(model, layout)
    schedule = build_schedule("1f1b", 4, 4)
    for r, n in enumerate((1, 4, 4, 1)):
        assert memory[r].activations_bytes == peak_in_flight(schedule[r]) * n * per_layer
    assert memory[1].params_bytes == 2 * 4 * model.layer_params(1)  # 2 bytes, 4 layers
