"""Multi-head latent attention (issue 19, item 2): parameters, kernels' FLOPs and bytes, model
FLOPs and the `[model]` rules, each against a hand count or a published figure."""

from __future__ import annotations

import dataclasses

import pytest

from sim.simulate import model_summary
from tests.traces.megatron_count import megatron_fwd
from traces.errors import ConfigError
from traces.header import TraceMeta
from traces.header_json import meta_from_json, meta_to_json
from traces.io import VERSION
from traces.kernels import layer_kernels
from traces.model import ModelSpec
from traces.purpose import Kernel as K
from traces.step_flops import megatron_num_flops, model_flops

# A small MLA model: h 64, a 4, q_r 32, k_r 16, d 16, r 8, d_v 12.
H, A, QR, KR, D, R, DV, S, F = 64, 4, 32, 16, 16, 8, 12, 32, 96
MLA = dict(q_lora_rank=QR, kv_lora_rank=KR, head_dim=D, qk_rope_head_dim=R, v_head_dim=DV,
           position="rope", norm="rmsnorm", bias=False)


def small(**over) -> ModelSpec:
    return ModelSpec(**{"layers": 2, "hidden": H, "heads": A, "seq_len": S, "vocab": 128,
                        "ffn": "swiglu", "ffn_hidden": F, **MLA, **over})


def deepseek_v3() -> ModelSpec:
    """DeepSeek-V3's attention (its config.json: hidden_size 7168, 128 heads, q_lora_rank 1536,
    kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128)."""
    return ModelSpec(layers=61, hidden=7168, heads=128, seq_len=4096, vocab=129280,
                     ffn="swiglu", ffn_hidden=18432, q_lora_rank=1536, kv_lora_rank=512,
                     head_dim=128, qk_rope_head_dim=64, v_head_dim=128, position="rope",
                     norm="rmsnorm", bias=False)


def test_deepseek_v3_attention_parameters_per_layer():
    q_down = 7168 * 1536
    q_norm = 1536
    q_up = 1536 * 128 * (128 + 64)
    kv_down = 7168 * (512 + 64)
    kv_norm = 512
    kv_up = 512 * 128 * (128 + 128)
    o_proj = 128 * 128 * 7168
    hand = q_down + q_norm + q_up + kv_down + kv_norm + kv_up + o_proj
    assert hand == 187_107_328
    assert deepseek_v3().attn_params() == hand


@pytest.mark.parametrize("qr", [QR, 0])
@pytest.mark.parametrize("t", [1, 2])
def test_layer_parameters_split_the_up_projections_and_replicate_the_down_one(qr, t):
    m = small(q_lora_rank=qr)
    split = (qr or H) * A * (D + R) + KR * A * (D + DV) + A * DV * H + H * 2 * F + F * H
    replicated = H * (qr + KR + R) + qr + KR + 2 * H  # down, latent norms, ln1, ln2
    assert m.layer_params(t) == split / t + replicated


def _by_name(m: ModelSpec, b: int, t: int) -> dict:
    return {k.name: k for k in layer_kernels(m, b, t, False)}


def _gemm(m_, n, k, e=2, g=2):
    """A weight GEMM's (flops, fwd bytes, bwd flops, bwd bytes), written out."""
    a, w, c = m_ * k, k * n, m_ * n
    return (2 * m_ * n * k, (a + w + c) * e, 4 * m_ * n * k,
            (c + w + a) * e + (a + c) * e + 2 * w * g)


@pytest.mark.parametrize("qr", [QR, 0])
@pytest.mark.parametrize("t", [1, 2])
def test_mla_kernels_flops_and_bytes_equal_the_hand_formulas(qr, t):
    m, b, e = small(q_lora_rank=qr), 2, 2
    n, ks = b * S, _by_name(small(q_lora_rank=qr), 2, t)
    assert [k for k in ks if k in (K.QKV, K.MLA_DOWN, K.LATENT_NORM, K.Q_UP, K.KV_UP)] == \
        [K.MLA_DOWN, K.LATENT_NORM, K.Q_UP, K.KV_UP]

    def work(name):
        k = ks[name]
        return (k.flops, k.mem_bytes, k.bwd_flops, k.bwd_bytes)

    assert work(K.MLA_DOWN) == _gemm(n, qr + KR + R, H)          # replicated: no /t
    assert work(K.LATENT_NORM) == (0, 2 * n * (qr + KR) * e, 0, 3 * n * (qr + KR) * e)
    assert work(K.Q_UP) == _gemm(n, A * (D + R) // t, qr or H)
    assert work(K.KV_UP) == _gemm(n, A * (D + DV) // t, KR)
    rope = n * (A // t * (4 * D + 3 * R) + R) * e + 4 * S * R
    assert work(K.ROPE) == (0, rope, 0, rope)
    heads = b * A // t
    core = 2 * heads * S * S * (D + R) + 2 * heads * S * S * DV  # the full square
    qkvo = heads * S * ((D + R) + (D + R) + DV + DV) * e
    lse = 4 * heads * S
    assert work(K.FLASH_ATTN) == (core / 2, qkvo + lse, 2.5 * core / 2, 2 * qkvo + lse)
    assert work(K.PROJ) == _gemm(n, H, A * DV // t)
    # Summed over its GEMMs (the core's full square), the block's forward is `attn_flops`.
    attn = sum(megatron_fwd(ks[k]) for k in (K.MLA_DOWN, K.Q_UP, K.KV_UP, K.FLASH_ATTN, K.PROJ))
    assert attn == pytest.approx(m.attn_flops(b, t), rel=1e-12)
    assert megatron_fwd(ks[K.FLASH_ATTN]) == pytest.approx(m.attn_core_flops(b, t), rel=1e-12)


def test_unfused_core_multiplies_q_k_of_d_plus_r_and_v_of_d_v():
    ks = _by_name(small(attention="unfused"), 1, 1)
    assert ks[K.QK].gemm == (A, S, S, D + R) and ks[K.AV].gemm == (A, S, DV, S)


@pytest.mark.parametrize("qr", [QR, 0])
def test_model_flops_against_megatrons_mla_branch(qr):
    """Megatron-LM counts the latent norms (+1 per rank) and half the core (causal); parasim
    the whole s² core and no norms: their difference per token and layer is
    6(q_r + k_r) − 3·s·a·(d + r + d_v)."""
    m, batch = small(q_lora_rank=qr), 8
    diff = batch * S * m.layers * (6 * (qr + KR) - 3 * S * A * (D + R + DV))
    assert megatron_num_flops(m, batch) - model_flops(m, batch) == pytest.approx(diff, rel=1e-9)
    assert megatron_num_flops(m, batch, causal=True) == megatron_num_flops(m, batch)  # causal
    gpt = ModelSpec(layers=2, hidden=H, heads=A, seq_len=S, vocab=128)  # unchanged path
    assert megatron_num_flops(gpt, batch) == pytest.approx(model_flops(gpt, batch), rel=1e-12)


def test_defaults_resolve_and_summary_names_it():
    m = small(v_head_dim=0, head_dim=0)
    assert (m.head_dim, m.v_head_dim) == (H // A, H // A)
    assert "MLA q_lora 32, kv_lora 16" in model_summary(small())
    plain = ModelSpec(layers=1, hidden=H, heads=A, seq_len=S, vocab=128)
    assert plain.head_dim == H // A and not plain.mla and "MLA" not in model_summary(plain)


def test_header_stores_the_keys_only_when_set():
    m = small()
    back = meta_from_json(meta_to_json(TraceMeta(model=m)), VERSION).model
    assert back == m
    plain = ModelSpec(layers=1, hidden=H, heads=A, seq_len=S, vocab=128)
    written = meta_to_json(TraceMeta(model=plain))["model"]
    assert not {"head_dim", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                "v_head_dim"} & set(written)
    assert meta_from_json(meta_to_json(TraceMeta(model=plain)), VERSION).model == plain


@pytest.mark.parametrize(("over", "field"), [
    ({"kv_lora_rank": -1}, "kv_lora_rank"),
    ({"kv_lora_rank": 2**40}, "kv_lora_rank"),
    ({"q_lora_rank": 1.5}, "q_lora_rank"),
    ({"qk_rope_head_dim": 0}, "qk_rope_head_dim"),
    ({"qk_rope_head_dim": 7}, "qk_rope_head_dim"),
    ({"position": "learned"}, "position"),
    ({"kv_heads": 2}, "kv_heads"),
    ({"norm": "layernorm"}, "norm"),
    ({"bias": True}, "bias"),
    ({"v_head_dim": True}, "v_head_dim"),
])
def test_bad_values_are_one_line_naming_the_field(over, field):
    with pytest.raises(ConfigError) as err:
        small(**over)
    assert str(err.value).startswith(f"model.{field}:") and "\n" not in str(err.value)


@pytest.mark.parametrize(("over", "field"), [
    ({"q_lora_rank": 8}, "q_lora_rank"), ({"v_head_dim": 8}, "v_head_dim"),
    ({"qk_rope_head_dim": 8}, "qk_rope_head_dim"),
])
def test_mla_keys_without_kv_lora_rank_are_refused(over, field):
    # (head_dim is every attention's since issue 32: tests/traces/test_heads.py)
    with pytest.raises(ConfigError, match=f"^model.{field}:"):
        ModelSpec(layers=1, hidden=H, heads=A, seq_len=S, vocab=128, **over)


def test_replace_keeps_a_valid_model():
    m = small()
    assert dataclasses.replace(m, seq_len=64).head_dim == D


H100_MLA = """
[model]
layers = 2
hidden = 256
heads = 4
seq_len = 128
vocab = 512
ffn = "swiglu"
ffn_hidden = 512
norm = "rmsnorm"
position = "rope"
bias = false
kv_lora_rank = 32
qk_rope_head_dim = 16
head_dim = 32
v_head_dim = 32
{extra}
{q_lora}

[parallel]
tp = 2
dp = 4
micro_batch = 1
global_batch = 8

[cluster]
preset = "dgx-h100"
nodes = 1
"""


def _simulate(tmp_path, capsys, extra=""):
    from sim.cli import main
    path = tmp_path / "mla.toml"
    q_lora = "" if extra.startswith("q_lora_rank") else "q_lora_rank = 64"
    path.write_text(H100_MLA.format(extra=extra, q_lora=q_lora))
    code = main(["simulate", str(path)])
    return code, capsys.readouterr()


def test_cli_simulates_mla_and_prints_it(tmp_path, capsys):
    code, out = _simulate(tmp_path, capsys)
    assert code == 0, out.err
    assert "MLA q_lora 64, kv_lora 32" in out.out


@pytest.mark.parametrize(("extra", "field"), [
    ("kv_heads = 2", "kv_heads"), ("q_lora_rank = 64.5", "q_lora_rank")])
def test_cli_bad_mla_values_are_one_line_exit_2(tmp_path, capsys, extra, field):
    code, out = _simulate(tmp_path, capsys, extra)
    assert code == 2
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and f"model.{field}" in lines[0], out.err


def test_with_sp_the_down_projection_and_norms_run_on_the_sequence_shard():
    """Megatron-Core's duplicated down-projection takes the SP shard; the up-projections the
    gathered latents (whole sequence)."""
    b, t = 2, 2
    ks = {k.name: k for k in layer_kernels(small(), b, t, True)}
    n, shard = b * S, b * S // t
    assert ks[K.MLA_DOWN].gemm == (1, shard, QR + KR + R, H)
    assert ks[K.LATENT_NORM].mem_bytes == 2 * shard * (QR + KR) * 2
    assert ks[K.Q_UP].gemm == (1, n, A * (D + R) // t, QR)
    assert ks[K.KV_UP].gemm == (1, n, A * (D + DV) // t, KR)


# --- FP8 (issue 32, item 2): DeepSeek-V3 trained MLA's GEMMs in FP8 ---------------------------

MLA_GEMMS = {K.MLA_DOWN, K.Q_UP, K.KV_UP, K.PROJ, K.FC1, K.FC2}


@pytest.mark.parametrize("qr", [QR, 0])
@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "rowwise", "blockwise", "mxfp8"])
def test_in_fp8_every_mla_gemm_is_fp8_and_the_flops_are_bf16s(qr, recipe):
    bf16 = small(q_lora_rank=qr)
    fp8 = dataclasses.replace(bf16, dtype="fp8", fp8_recipe=recipe)
    for sp in (False, True):
        plain, cast = layer_kernels(bf16, 2, 2, sp), layer_kernels(fp8, 2, 2, sp)
        assert {k.name for k in cast if k.fp8} == MLA_GEMMS
        assert {k.name: k.gemm for k in cast if k.gemm} == {k.name: k.gemm for k in plain
                                                            if k.gemm}
        for phase in ("flops", "bwd_flops"):
            assert sum(getattr(k, phase) for k in cast) == sum(getattr(k, phase) for k in plain)
        core = {K.FLASH_ATTN, K.ROPE}
        assert [k for k in cast if k.name in core] == [k for k in plain if k.name in core]
    assert fp8.num_params() == bf16.num_params() and model_flops(fp8, 8) == model_flops(bf16, 8)


def test_in_fp8_the_latent_norm_is_q_ups_and_kv_ups_layernormlinear():
    """Delayed scaling: the latent norm writes c_q and c_kv in FP8 (1 byte, not 2) and their
    casts are transposes; ln1 (TENorm) and mla_down's cast (TELinear) stay unfused."""
    b, t = 2, 2
    fp8 = small(dtype="fp8")
    ks = layer_kernels(fp8, b, t, True)
    names = [k.name for k in ks]
    latents, shard, n = b * S // t * (QR + KR), b * S // t, b * S
    norm = ks[names.index(K.LATENT_NORM)]
    assert norm.mem_bytes == 2 * latents + latents and norm.bwd_bytes == 3 * latents * 2
    down_cast = ks[names.index(K.MLA_DOWN) - 1]
    assert (down_cast.name, down_cast.mem_bytes) == (K.FP8_CAST, 4 * shard * H)
    for gemm, width in ((K.Q_UP, QR), (K.KV_UP, KR)):
        cast = ks[names.index(gemm) - 1]
        assert (cast.name, cast.mem_bytes) == (K.FP8_CAST, 2 * n * width)
    ln1 = ks[names.index(K.LN1)]
    assert ln1.mem_bytes == 2 * 2 * shard * H


def test_fp8_mla_weights_and_amaxes_count_its_six_gemms():
    """mla_down on every TP rank, q_up, kv_up and proj split: the step's weight cast and
    delayed scaling's amaxes (3 forward, 2 backward per FP8 GEMM) count them all."""
    from traces.fp8 import fp8_gemms_per_layer, fp8_weights_per_layer
    from traces.mla import mla_params
    fp8 = small(dtype="fp8")
    split, _ = mla_params(fp8)
    weights = split / 2 + H * (QR + KR + R) + (H * 2 * F + F * H) / 2
    assert fp8_weights_per_layer(fp8, 0, 2) == weights
    assert fp8_gemms_per_layer(fp8, 0) == 6


def test_cli_simulates_mla_in_fp8(tmp_path, capsys):
    code, out = _simulate(tmp_path, capsys, "dtype = \"fp8\"")
    assert code == 0, out.err
    assert "fp8 (delayed scaling" in out.out


@pytest.mark.parametrize(("qr", "forward"), [(QR, 1), (0, 2)])
def test_current_scaling_reduces_over_tp_only_what_te_gathers(qr, forward):
    """With SP: fc1's input forward (and q_up's when it reads ln1's output, which TE gathers;
    not the latents, which Megatron-Core gathers itself), proj's and fc2's output gradients
    backward: 4 bytes each over the TP group."""
    from traces.layout import Layout
    from traces.plan import build
    from traces.purpose import AmaxReduction
    fp8 = small(dtype="fp8", fp8_recipe="tensorwise", q_lora_rank=qr)
    layout = Layout(tp=2, dp=2, sp=True, global_batch=2, recompute="none")
    ops = build(fp8, layout).ops[0]
    found = [op for op in ops if isinstance(op.purpose, AmaxReduction)]
    per_layer = forward + 2
    assert len(found) == layout.num_microbatches * fp8.layers * per_layer
    assert {(op.group, op.size_bytes) for op in found} == {((0, 1), 4)}
