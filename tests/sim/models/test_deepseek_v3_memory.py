"""The shipped DeepSeek-V3 2,048-H800 example's memory as the report saves it: a layer's
stored bytes at DeepSeek-V3's published widths in closed form, and its MTP module sharing the
embedding and output head of the main model on DualPipe's first-and-last rank."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sim.config import load_experiment
from sim.models.memory import activation_bytes_per_layer
from traces.mtp import mtp_extra_params, mtp_stage_extra

EXAMPLE = Path(__file__).parents[3] / "sim" / "examples" / "deepseek-v3-2048-h800.toml"
H, A, DV, F, QR, KR, S = 7168, 128, 128, 18432, 1536, 512, 4096


def test_a_layer_keeps_norm_inputs_latents_o_in_e5m6_and_fc2_input_in_fp8():
    exp = load_experiment(EXAMPLE)
    model, layout = exp.model, exp.layout
    assert layout.recompute_modules == ("layernorm", "mla_up_proj", "moe_act")
    # ln1 and ln2 inputs 2 + 2; the latents 2(q_r + k_r)/h; O in 1.5 bytes; SwiGLU's
    # gate and up 4f/h and fc2's input in FP8 f/h
    per_sbh = 4 + 2 * (QR + KR) / H + 1.5 * A * DV / H + 5 * F / H
    assert activation_bytes_per_layer(model, layout) == per_sbh * S * H
    plain = dataclasses.replace(layout, recompute="none", recompute_modules=(),
                                fp8_activation_cache=False)
    # before: the norm outputs 4, Q and K 2·a(d + r), V and O 2·a·d_v, SwiGLU 6f/h, latents
    # twice 4(q_r + k_r)/h
    before = 8 + 4 * A * (128 + 64 + DV) / H + 6 * F / H + 4 * (QR + KR) / H
    assert activation_bytes_per_layer(model, plain) == before * S * H


def test_the_mtp_module_shares_the_embedding_and_head_on_dualpipes_first_rank():
    exp = load_experiment(EXAMPLE)
    model, layout = exp.model, exp.layout
    stages = layout.stages_of_rank(0)
    assert 0 in stages and layout.num_stages - 1 in stages  # DualPipe(V): first and last
    assert mtp_stage_extra(model, stages, 1) == mtp_extra_params(model, 1)  # no copy
    assert mtp_stage_extra(model, [layout.num_stages - 1], 1) == \
        mtp_extra_params(model, 1) + model.vocab * H  # a copy where they are apart
