"""`recompute_modules`, `fp8_activation_cache` and the moments' dtypes in the memory model:
each term exact in closed form on a small latent-attention MoE model (sim.models.
saved_activations), the DeepSeek-V3 example's peak below the one without them."""

from __future__ import annotations

import dataclasses

import pytest

from sim.models.memory import activation_bytes_per_layer, memory_by_pp_rank, working_bytes
from sim.models.moe_memory import moe_activation_delta
from traces.layout import Layout
from traces.model import ModelSpec

# h 64, a 4, q_r 32, k_r 16, d 16, r 8, d_v 12, SwiGLU f 96, s 32; layer 0 dense, layer 1
# MoE: 4 experts of 32, top-2, one shared expert.
H, A, QR, KR, D, R, DV, S, F, FE = 64, 4, 32, 16, 16, 8, 12, 32, 96, 32
MODEL = ModelSpec(layers=2, hidden=H, heads=A, seq_len=S, vocab=128, ffn="swiglu",
                  ffn_hidden=F, q_lora_rank=QR, kv_lora_rank=KR, head_dim=D,
                  qk_rope_head_dim=R, v_head_dim=DV, position="rope", norm="rmsnorm",
                  bias=False, dropout=0.0, experts=4, top_k=2, moe_ffn_hidden=FE,
                  shared_experts=1, dense_layers=1, dtype="fp8")
SBH = S * H
DEEPSEEK = ["layernorm", "mla_up_proj", "moe_act"]


def layout(modules: list[str] | None = None, fp8: bool = False, **over: object) -> Layout:
    return Layout(recompute="selective" if modules else "none",
                  recompute_modules=modules or [], fp8_activation_cache=fp8, **over)


def test_the_dense_layer_without_options_is_the_korthikanti_count():
    # norms' inputs and qkv/fc1 inputs 8; Q, K 2a(d+r) and V, O 2a·d_v; SwiGLU 6f/h;
    # latents and their normalized copies 4(q_r + k_r)/h.
    per_sbh = 8 + (4 * A * (D + R) + 4 * A * DV) / H + 6 * F / H + 4 * (QR + KR) / H
    assert per_sbh == 29
    assert activation_bytes_per_layer(MODEL, layout()) == 29 * SBH


def test_layernorm_and_mla_up_proj_drop_the_norm_outputs_and_q_k_v():
    # left: the norms' inputs 4, O 2a·d_v/h = 1.5, SwiGLU 9, the latents 2(q_r + k_r)/h = 1.5
    assert activation_bytes_per_layer(MODEL, layout(["layernorm", "mla_up_proj"])) == 16 * SBH
    only_norms = activation_bytes_per_layer(MODEL, layout(["layernorm"]))
    assert only_norms == (29 - 4) * SBH  # qkv's and fc1's inputs, 2 + 2


def test_the_fp8_cache_keeps_linear_inputs_in_one_byte_and_o_in_e5m6():
    # replicated 8 -> 6 (qkv and fc1 inputs in 1 byte); O 2 -> 1.5 bytes: 0.5·48/64 = 0.375;
    # fc2's input 2f/h -> f/h: 1.5; normalized latents 1.5 -> 0.75.
    assert activation_bytes_per_layer(MODEL, layout(fp8=True)) == \
        (29 - 2 - 0.375 - 1.5 - 0.75) * SBH
    both = activation_bytes_per_layer(MODEL, layout(DEEPSEEK, fp8=True))
    assert both == (4 + 1.125 + 7.5 + 1.5) * SBH


def test_the_moe_layer_with_moe_act_and_the_fp8_cache():
    # ep = 1: 32 tokens, 64 kept assignments, all processed here; router scores 32·4·(4 + 1).
    kept, router = 64, 32 * 4 * 5
    base = SBH * (6 * FE / H - 6 * F / H) + kept * (H + 3 * FE) * 2 + kept * H * 2 + router
    assert moe_activation_delta(MODEL, layout(), 1) == base
    act = SBH * (4 * FE / H - 6 * F / H) + kept * (H + 2 * FE) * 2 + kept * H * 2 + router
    assert moe_activation_delta(MODEL, layout(["moe_act"]), 1) == act
    # FP8 halves what is kept of the experts' inputs; the dense MLP taken out is its FP8 count
    both = SBH * (2 * FE / H - 5 * F / H) + kept * (H + 2 * FE) + kept * H * 2 + router
    assert moe_activation_delta(MODEL, layout(DEEPSEEK, fp8=True), 1) == both
    assert moe_activation_delta(MODEL, layout(DEEPSEEK, fp8=True), 0) == 0.0


def test_bf16_moments_make_adam_eight_bytes_a_parameter():
    full = memory_by_pp_rank(MODEL, Layout(dp=2, zero=1, global_batch=2))[0]
    narrow = memory_by_pp_rank(MODEL, Layout(dp=2, zero=1, global_batch=2,
                                             exp_avg_dtype="bf16",
                                             exp_avg_sq_dtype="bf16"))[0]
    assert narrow.optimizer_bytes == pytest.approx(full.optimizer_bytes * 8 / 12, rel=1e-15)
    fp8 = memory_by_pp_rank(MODEL, Layout(dp=2, zero=1, global_batch=2, exp_avg_dtype="fp8",
                                          exp_avg_sq_dtype="bf16"))[0]
    assert fp8.optimizer_bytes == pytest.approx(full.optimizer_bytes * 7 / 12, rel=1e-15)
    assert (narrow.params_bytes, narrow.grads_bytes) == (full.params_bytes, full.grads_bytes)


def test_options_off_leave_every_breakdown_unchanged():
    plain = memory_by_pp_rank(MODEL, Layout(recompute="selective"))
    stated = memory_by_pp_rank(MODEL, dataclasses.replace(
        Layout(recompute="selective"), exp_avg_dtype="fp32"))
    assert plain == stated


def test_the_layer_in_backward_holds_what_its_modules_recompute():
    # dense layer: 13·sbh (29 - 16); the MoE layer with moe_act: its fc2 inputs too
    plain = working_bytes(MODEL, layout(), 0)
    assert working_bytes(MODEL, layout(["layernorm", "mla_up_proj"]), 0) - plain == 13 * SBH
    kept = 64
    moe_act = SBH * 2 * FE / H + kept * FE * 2  # shared 2Sf/h, routed f per token, 2 bytes
    assert working_bytes(MODEL, layout(DEEPSEEK), 0) - plain == 13 * SBH + moe_act


def test_mlp_spares_the_dense_mlp_and_its_norm_output_only():
    # dense layer: SwiGLU 6f/h = 9 and fc1's input (the pre-MLP norm's output) 2 go: 29 - 11
    assert activation_bytes_per_layer(MODEL, layout(["mlp"])) == 18 * SBH
    # with layernorm the norm output is gone already: only the MLP's 9 more
    assert activation_bytes_per_layer(MODEL, layout(["layernorm", "mlp"])) == (29 - 4 - 9) * SBH
    # the MoE layer is not recomputed: its delta gives back exactly what "mlp" took off
    for modules in (["mlp"], ["layernorm", "mlp"]):
        with_mlp = activation_bytes_per_layer(MODEL, layout(modules)) + \
            moe_activation_delta(MODEL, layout(modules), 1)
        without = [m for m in modules if m != "mlp"]
        assert with_mlp == activation_bytes_per_layer(MODEL, layout(without)) + \
            moe_activation_delta(MODEL, layout(without), 1)
    assert moe_activation_delta(MODEL, layout(["mlp"]), 0) == 0.0


def test_mlp_without_sequence_parallelism_spares_the_whole_norm_output():
    # t = 2, no SP: the norm output is replicated (2 whole), the MLP split (9/2)
    plain = activation_bytes_per_layer(MODEL, layout(tp=2))
    assert plain - activation_bytes_per_layer(MODEL, layout(["mlp"], tp=2)) == (2 + 9 / 2) * SBH
    sp = activation_bytes_per_layer(MODEL, layout(tp=2, sp=True))
    assert sp - activation_bytes_per_layer(MODEL, layout(["mlp"], tp=2, sp=True)) == \
        (2 + 9) / 2 * SBH


def test_the_layer_in_backward_holds_what_mlp_recomputes():
    # the dense layer re-creates its 11·sbh; the MoE layer (not recomputed) nothing
    plain = working_bytes(MODEL, layout(), 0)
    assert working_bytes(MODEL, layout(["mlp"]), 0) - plain == 11 * SBH


def test_mlp_under_transformer_engines_fp8_spares_what_te_would_have_kept():
    # TE FP8 (no MLA, fused kernels, MXFP8 q = 1/32): the dense MLP keeps SwiGLU 6f/h less
    # fc2's FP8 saving f/h·(1 - q), and fc1's input as one FP8 copy 1 + q; "mlp" spares both.
    gpt = ModelSpec(layers=2, hidden=H, heads=A, seq_len=S, vocab=128, ffn="swiglu",
                    ffn_hidden=F, dtype="fp8", fp8_recipe="mxfp8", kernels="fused")
    q = 1 / 32
    kept_mlp = 6 * F / H - F / H * (1 - q)
    plain = activation_bytes_per_layer(gpt, layout())
    assert plain - activation_bytes_per_layer(gpt, layout(["mlp"])) == \
        pytest.approx((kept_mlp + 1 + q) * SBH, rel=1e-15)
