"""Multi-token prediction (`traces.mtp`, `[model] mtp_layers`): DeepSeek-V3's published
parameter count, Megatron-LM's FLOPs formula, the stage that runs it, its ops in the plan and
the one-line refusals."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from traces.errors import ConfigError
from traces.header import TraceMeta
from traces.header_json import meta_from_json, meta_to_json
from traces.io import VERSION
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.mtp import megatron_mtp_term, mtp_params
from traces.mtp_kernels import mtp_kernels
from traces.plan import build
from traces.purpose import Kernel
from traces.step_flops import megatron_num_flops, model_flops, recompute_flops

H, V = 7168, 129280


def deepseek_v3(mtp: int = 0) -> ModelSpec:
    """DeepSeek-V3's released config.json (as sim/examples/deepseek-v3-1024-h100.toml)."""
    return ModelSpec(layers=61, hidden=H, heads=128, seq_len=4096, vocab=V, ffn="swiglu",
                     ffn_hidden=18432, norm="rmsnorm", position="rope", bias=False,
                     tied_embeddings=False, dropout=0.0, kv_lora_rank=512, q_lora_rank=1536,
                     head_dim=128, qk_rope_head_dim=64, v_head_dim=128, experts=256, top_k=8,
                     moe_ffn_hidden=2048, shared_experts=1, dense_layers=3, mtp_layers=mtp)


def test_deepseek_v3_with_its_mtp_module_is_the_published_685b():
    """Hugging Face's model card: 671B main model + 14B MTP module = 685B. The module as the
    checkpoint stores it (model.layers.61) is one MoE layer by hand — MLA 7168·1536 + 1536 +
    1536·128·192 + 7168·576 + 512 + 512·128·256 + 128·128·7168, two norms, router 7168·256,
    257 experts of 3·7168·2048 — plus enorm, hnorm, the final norm and eh_proj 2·7168², plus
    its copies of the embedding and the output layer (2·V·h). 671.03B + 13.46B = 684.49B; the
    checkpoint's FP8 weights add one fp32 scale per 128x128 block (~1/16384 of them, ~0.04B),
    which is how Hugging Face's 685B (and 14B) round."""
    mla = (H * 1536 + 1536 + 1536 * 128 * 192 + H * 576 + 512 + 512 * 128 * 256
           + 128 * 128 * H)
    layer = mla + 2 * H + H * 256 + 257 * 3 * H * 2048
    own = layer + 3 * H + 2 * H * H
    assert mtp_params(deepseek_v3(1)) == own
    main, with_mtp = deepseek_v3().num_params(), deepseek_v3(1).num_params()
    assert with_mtp - main == own
    assert round(main / 1e9) == 671
    module = own + 2 * V * H
    assert module == 13_463_426_048
    assert main + module == 684_489_830_400
    assert abs(main + module - 685e9) / 685e9 < 1e-3
    # the 8 active of 256 routed experts: the MTP layer's inactive ones left out too
    assert with_mtp - deepseek_v3(1).active_params() == \
        main - deepseek_v3().active_params() + 248 * 3 * H * 2048


def gpt(mtp: int = 0, layers: int = 4) -> ModelSpec:
    return ModelSpec(layers=layers, hidden=256, heads=8, seq_len=128, vocab=1024,
                     mtp_layers=mtp)


def test_megatron_flops_count_each_depth_as_one_more_layer_logits_and_its_proj():
    """training.py: num_layers + mtp_num_layers layers (MoE when the last one is), logits
    times mtp_num_layers + 1, plus 3·2·mtp·(3h + 2h²) per token."""
    B, s = 16, 4096
    m1 = deepseek_v3(1)
    plus_layer = replace(deepseek_v3(), layers=62)  # one more MoE layer
    extra = 6 * B * s * H * V + 6 * B * s * (3 * H + 2 * H * H)
    assert megatron_num_flops(m1, B) == pytest.approx(megatron_num_flops(plus_layer, B) + extra,
                                                      rel=1e-12)


def test_model_flops_add_the_depths_gemms_and_megatron_adds_only_its_norms():
    """The kernels' sum counts the layer, eh_proj 2bs·2h·h and the logits; Megatron-LM also
    counts 3h per token for the norms (6·B·s·3h over the step)."""
    B, g1, g0 = 8, gpt(1), gpt(0)
    s, h = g1.seq_len, g1.hidden
    per_sample = g0.attn_flops(1) + g0.mlp_flops(1) + 4 * s * h * h + g0.head_flops(1)
    assert model_flops(g1, B) == pytest.approx(model_flops(g0, B) + 3 * B * per_sample)
    assert megatron_num_flops(g0, B) == pytest.approx(model_flops(g0, B), rel=1e-12)
    assert megatron_num_flops(g1, B) - model_flops(g1, B) == pytest.approx(6 * B * s * 3 * h)
    assert recompute_flops(g1, B, "full") == pytest.approx(
        recompute_flops(gpt(0, 5), B, "full"))


def interleaved(pp: int, vp: int, **keys: object) -> Layout:
    return Layout(pp=pp, vp=vp, schedule="interleaved", global_batch=pp, **keys)


def test_deepseek_v3s_layout_places_its_mtp_layer_with_the_loss():
    """`Et|(tt|)*30mL` on PP 16 x VP 2: 32 virtual stages, 61 layers, and the MTP depth
    (layer 61) on stage 31, rank 15's second chunk, with the loss."""
    m, layout = deepseek_v3(1), interleaved(16, 2, pipeline_layout="Et|(tt|)*30mL")
    check_layout(m, layout)
    assert layout.stage_layers(m) == (1,) + (2,) * 30 + (1,)
    assert layout.layers_of_stage(m, 31) == range(61, 62)
    assert layout.layers_of_stage(m, 30) == range(59, 61)
    assert layout.layers_of_rank(m, 15) == 3 and layout.layers_of_rank(m, 0) == 3


def test_without_a_layout_the_depths_run_on_the_last_stage():
    m = gpt(2, layers=4)
    layout = Layout(pp=2, global_batch=2)
    check_layout(m, layout)
    assert layout.layers_of_stage(m, 0) == range(0, 2)
    assert layout.layers_of_stage(m, 1) == range(2, 6)


@pytest.mark.parametrize(("mtp", "text", "message"), [
    (0, "Et|tmL", "parallel.pipeline_layout: 1 MTP layers (m), but model.mtp_layers = 0"),
    (2, "Et|tmL", "parallel.pipeline_layout: 1 MTP layers (m), but model.mtp_layers = 2"),
    (1, "Etm|tL", "parallel.pipeline_layout: 'm' in virtual stage 0: MTP layers must be in the "
                  "last virtual stage 1, with the loss L"),
])
def test_layout_m_must_match_mtp_layers_and_sit_with_the_loss(mtp, text, message):
    with pytest.raises(ConfigError) as info:
        check_layout(gpt(mtp, layers=2), Layout(pp=2, global_batch=2, pipeline_layout=text))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize("value", [-1, 65, True, 1.0, "1"])
def test_bad_mtp_layers_is_one_line(value):
    with pytest.raises(ConfigError) as info:
        gpt(value)
    assert str(info.value).startswith(f"model.mtp_layers: {value!r}"[:18])
    assert "\n" not in str(info.value)


def test_the_plan_runs_the_depth_as_the_last_layer_with_its_lookup_and_head():
    """MoE model, TP 2 with SP, PP 2, EP 2, ZeRO-1, 4 micro-batches: on a last-stage rank,
    layer 4 (the MTP depth) has the ops of layer 3 (the last MoE layer: kernels, TP/SP
    collectives, all-to-alls, expert gradients) plus, per micro-batch, the shifted tokens'
    lookup (embed, pos_embed) with its SP reduce-scatter forward and all-gather backward,
    then enorm, hnorm, their concatenation and eh_proj (`traces.mtp_kernels`; the
    concatenation's backward is a view, no op);
    the shared head runs twice per micro-batch (the depth's, then the main model's); the
    depth's three norms join its SP gradient sum (3h bf16); the embedding copy's gradient is
    all-reduced with stage 0's (V·h/t bf16)."""
    m = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, ffn="swiglu",
                  ffn_hidden=128, norm="rmsnorm", position="rope", bias=False, dropout=0.0,
                  tied_embeddings=False, experts=4, top_k=2, moe_ffn_hidden=32, dense_layers=1,
                  mtp_layers=1)
    layout = Layout(tp=2, pp=2, dp=2, ep=2, sp=True, micro_batch=1, global_batch=8, zero=1)
    plan = build(m, layout)
    ops = plan.ops[max(plan.ops)]

    def by_layer(layer: int) -> Counter:
        return Counter((o.name, o.phase.value, o.kind.value, o.microbatch) for o in ops
                       if o.layer == layer)

    lookup = Counter({("embed", "fwd", "compute"): 1, ("pos_embed", "fwd", "compute"): 1,
                      ("tp", "fwd", "reduce_scatter"): 1, ("tp", "bwd", "all_gather"): 1,
                      ("pos_embed", "bwd", "compute"): 1, ("embed", "bwd", "compute"): 1,
                      **{(k, "fwd", "compute"): 1 for k in ("mtp_enorm", "mtp_hnorm",
                                                            "mtp_concat", "eh_proj")},
                      **{(k, "bwd", "compute"): 1 for k in ("mtp_enorm", "mtp_hnorm",
                                                            "eh_proj")}})
    extra = Counter({(*key, mb): n for key, n in lookup.items() for mb in range(4)})
    assert by_layer(4) - by_layer(3) == extra and not by_layer(3) - by_layer(4)
    head = Counter((o.name, o.phase.value) for o in ops
                   if o.microbatch == 1 and o.layer is None and o.name in
                   ("final_ln", "logits", "cross_entropy", "ce_max", "ce_sum"))
    assert set(head.values()) == {2} and len(head) == 8
    sp = {o.layer: o.size_bytes for o in ops if o.name == "sp_grads"}
    assert sp[4] - sp[3] == 3 * 64 * 2
    for rank in (0, max(plan.ops)):
        assert [o.size_bytes for o in plan.ops[rank] if o.name == "embedding_grads"] == \
            [128 * 64 / 2 * 2]
    assert not [o for o in plan.ops[0] if o.layer == 4]  # not on the first stage


def test_default_zero_changes_no_plan_and_no_header():
    m0 = gpt(0)
    written = meta_to_json(TraceMeta(model=m0))["model"]
    assert "mtp_layers" not in written
    assert meta_from_json(meta_to_json(TraceMeta(model=gpt(1))), VERSION).model == gpt(1)
    layout = Layout(tp=2, pp=2, global_batch=4)
    ops = build(m0, layout).ops
    assert max(o.layer for rank in ops.values() for o in rank if o.layer is not None) == 3


def test_a_depths_own_kernels_have_the_flops_and_bytes_of_its_norms_and_eh_proj():
    """enorm and hnorm read and write n = b·(s/t)·h values each (hnorm's backward also sums
    the main head's gradient: 6n·e), the concatenation 4n·e, eh_proj 2·b·s·2h·h/t FLOPs:
    summed over a step, Megatron-LM's 6·(2h²) a token for eh_proj, as `megatron_mtp_term`."""
    m = gpt(1)
    b, t, s, h, e = 2, 2, m.seq_len, m.hidden, 2
    works = {w.name: w for w in mtp_kernels(m, b, t, True, e)}
    n = b * s // t * h
    assert [str(k) for k in works] == ["mtp_enorm", "mtp_hnorm", "mtp_concat", "eh_proj"]
    assert (works[Kernel.MTP_ENORM].mem_bytes, works[Kernel.MTP_ENORM].bwd_bytes) == \
        (2 * n * e, 3 * n * e)
    assert works[Kernel.MTP_HNORM].bwd_bytes == 6 * n * e
    assert (works[Kernel.MTP_CONCAT].mem_bytes, works[Kernel.MTP_CONCAT].bwd_bytes) == \
        (4 * n * e, 0)
    proj = works[Kernel.EH_PROJ]
    assert proj.gemm == (1, b * s, h // t, 2 * h) and proj.flops == 2 * b * s * 2 * h * h / t
    per_token = (proj.flops + proj.bwd_flops) * t / (b * s)
    assert per_token * b * s == megatron_mtp_term(m, b) - b * s * 6 * 3 * h
