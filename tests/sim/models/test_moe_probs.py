"""`[model] moe_probs_in_activation` (traces.moe_probs): the routing probabilities applied in the
experts' activation, as Megatron-Core >= 0.13 does, keep R fp32 probabilities for backward in
place of the A·h·e expert outputs the unpermute's multiply kept; exact at a small model's and
at DeepSeek-V3's widths, the unpermute's and the activation's bytes in closed form, and the
shipped DeepSeek-V3 2,048-H800 layout's peak with and without it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from sim.config import load_experiment
from sim.models.memory import memory_by_pp_rank
from sim.models.moe_memory import moe_activation_delta
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe import ExpertShard, routed_kernels
from traces.moe_spec import MOE_KEYS
from traces.moe_steps import unpermute_steps
from traces.purpose import Kernel

EXAMPLE = Path(__file__).parents[3] / "sim" / "examples" / "deepseek-v3-2048-h800.toml"
H, S, FE = 64, 32, 32
MODEL = ModelSpec(layers=2, hidden=H, heads=4, seq_len=S, vocab=128, ffn="swiglu",
                  ffn_hidden=96, position="rope", norm="rmsnorm", bias=False, dropout=0.0,
                  experts=4, top_k=2, moe_ffn_hidden=FE, shared_experts=1, dense_layers=1)
WEIGHED = dataclasses.replace(MODEL, moe_probs_in_activation=True)


def test_the_activation_keeps_r_fp32_probs_instead_of_the_a_expert_outputs():
    # ep = 1: 32 tokens, A = 64 kept assignments, R = 64 processed here
    kept = received = 64
    layout = Layout()
    before = moe_activation_delta(MODEL, layout, 1)
    after = moe_activation_delta(WEIGHED, layout, 1)
    assert before - after == kept * H * 2 - received * 4
    # EP 2 with ep ranks of its own tokens: the same per rank under balanced routing
    ep2 = Layout(dp=2, ep=2, global_batch=2)
    assert moe_activation_delta(MODEL, ep2, 1) - moe_activation_delta(WEIGHED, ep2, 1) == \
        kept * H * 2 - received * 4
    assert moe_activation_delta(WEIGHED, layout, 0) == 0.0  # the dense layer


def test_at_deepseek_v3_widths_a_moe_layer_spares_0_44_gib_per_micro_batch():
    exp = load_experiment(EXAMPLE)
    model, layout = exp.model, exp.layout
    assert not model.moe_probs_in_activation  # the report does not say where g_i,t multiplies
    weighed = dataclasses.replace(model, moe_probs_in_activation=True)
    # T = 4,096 tokens, k = 8, h = 7,168; EP 64 balanced: R = 64 ranks x 4 experts x 128 = T·k
    a = 4096 * 8
    spared = a * 7168 * 2 - a * 4
    assert spared == 469_630_976  # 0.4375 GiB of expert outputs less 128 KiB of probabilities
    layer = model.dense_layers  # the first MoE layer
    assert moe_activation_delta(model, layout, layer) - \
        moe_activation_delta(weighed, layout, layer) == spared


def test_the_shipped_h800_layout_fits_in_80_gb_with_it():
    exp = load_experiment(EXAMPLE)
    model, layout = exp.model, exp.layout
    weighed = dataclasses.replace(model, moe_probs_in_activation=True)
    before = max(m.total_bytes for m in memory_by_pp_rank(model, layout))
    after = max(m.total_bytes for m in memory_by_pp_rank(weighed, layout))
    assert before == 98_453_952_768  # 91.7 GiB: over the H800's 80 GiB
    # the peak rank keeps 17 chunk passes of 4 MoE layers (docs/memory-model.md): 68 x fewer
    assert before - after == 68 * 469_630_976
    assert after == 66_519_046_400  # 62.0 GiB: fits
    assert after < 80 * 2**30 < before


def test_the_unpermute_reads_no_probs_and_the_activation_reads_them():
    t, a = 32, 64
    rows, out = a * H * 2, t * H * 2
    assert unpermute_steps(WEIGHED, t, a) == ([("moe_unpermute", rows + out)],
                                              [("moe_unpermute_bwd", out + rows)])
    assert unpermute_steps(MODEL, t, a) == ([("moe_unpermute", a * (H * 2 + 4) + out)],
                                            [("moe_unpermute_bwd", out + rows + a * (H * 2 + 4))])
    unfused = dataclasses.replace(WEIGHED, moe_permute_fusion=False)
    assert unpermute_steps(unfused, t, a) == ([("zeros", out), ("scatter_add", a * 8 + 3 * rows)],
                                              [("gather", a * 8 + 2 * rows)])
    shard = ExpertShard(ep=1, etp=1, ep_rank=0)

    def act(model: ModelSpec) -> tuple[float, float]:
        work = next(w for w in routed_kernels(model, 1, t, shard, 2)
                    if w.name == Kernel.EXPERT_ACT)
        return work.mem_bytes, work.bwd_bytes

    (f0, b0), (f1, b1) = act(MODEL), act(WEIGHED)
    assert (f1 - f0, b1 - b0) == (64 * 4, 2 * 64 * 4)  # R probs read; read again, grads written


def test_the_key_is_refused_off_an_moe_model_and_written_only_where_set():
    with pytest.raises(ConfigError, match=r"model.moe_probs_in_activation: True needs "
                       r"model.experts > 0"):
        ModelSpec(layers=2, hidden=H, heads=4, seq_len=S, vocab=128,
                  moe_probs_in_activation=True)
    with pytest.raises(ConfigError, match="must be true or false"):
        dataclasses.replace(MODEL, moe_probs_in_activation="yes")
    assert "moe_probs_in_activation" in MOE_KEYS


def test_the_cli_refuses_a_non_boolean_in_one_line_with_status_2(tmp_path: Path):
    text = EXAMPLE.read_text().replace("[model]\n", "[model]\nmoe_probs_in_activation = 1\n", 1)
    (tmp_path / "bad.toml").write_text(text)
    run = subprocess.run([sys.executable, "-m", "sim", "simulate", str(tmp_path / "bad.toml")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "parasim: error: model.moe_probs_in_activation: 1 must be true or false"]
