"""`[parallel] recompute_modules` (Megatron-Core's --recompute-modules, traces.recompute) in
the plan: which kernels run again before each layer's backward, their FLOPs in closed form,
core_attn as `selective` alone; its rules and the other new keys' as one-line errors."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from traces.errors import ConfigError
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.ops import Phase
from traces.pipeline import build_schedule
from traces.plan import build
from traces.plan.compute import lower_compute
from traces.plan.nodes import RankContext

H, A, QR, KR, D, R, DV, S, F, FE = 64, 4, 32, 16, 16, 8, 12, 32, 96, 32
MODEL = ModelSpec(layers=2, hidden=H, heads=A, seq_len=S, vocab=128, ffn="swiglu",
                  ffn_hidden=F, q_lora_rank=QR, kv_lora_rank=KR, head_dim=D,
                  qk_rope_head_dim=R, v_head_dim=DV, position="rope", norm="rmsnorm",
                  bias=False, dropout=0.0, experts=4, top_k=2, moe_ffn_hidden=FE,
                  shared_experts=1, dense_layers=1, attention="flash")
DEEPSEEK = ["layernorm", "mla_up_proj", "moe_act"]


def backward_ops(model: ModelSpec, **parallel: object):
    layout = Layout(**{"global_batch": 1, **parallel})
    ctx = RankContext(model=model, layout=layout, rank=0)
    program = lower_compute(ctx, build_schedule("1f1b", 1, 1)[0])
    return [n.op for n in program[1]]


def recomputed(model: ModelSpec, modules: list[str]) -> list[str]:
    ops = backward_ops(model, recompute="selective", recompute_modules=modules)
    return [op.name for op in ops if op.phase is Phase.RECOMPUTE]


def test_deepseeks_modules_rerun_norms_up_projections_rope_and_the_moe_activations():
    # the backward runs the last layer (MoE) first
    moe = ["ln1", "latent_norm", "q_up", "kv_up", "rope", "ln2", "expert_act", "swiglu"]
    dense = ["ln1", "latent_norm", "q_up", "kv_up", "rope", "ln2"]
    assert recomputed(MODEL, DEEPSEEK) == moe + dense


def test_fp8_reruns_the_casts_of_the_recomputed_inputs():
    fp8 = dataclasses.replace(MODEL, dtype="fp8")
    names = recomputed(fp8, DEEPSEEK)
    # mla_down's and fc1's inputs (norm outputs), q_up's and kv_up's, the shared fc2's
    assert names == ["ln1", "fp8_cast", "latent_norm", "fp8_cast", "q_up", "fp8_cast", "kv_up",
                     "rope", "ln2", "expert_act", "fp8_cast", "swiglu", "fp8_cast",
                     "ln1", "fp8_cast", "latent_norm", "fp8_cast", "q_up", "fp8_cast",
                     "kv_up", "rope", "ln2", "fp8_cast"]


def test_recomputed_flops_are_the_two_up_projections():
    ops = backward_ops(MODEL, recompute="selective", recompute_modules=DEEPSEEK)
    q_up, kv_up = 2 * S * QR * A * (D + R), 2 * S * KR * A * (D + DV)
    assert sum(op.flops for op in ops if op.phase is Phase.RECOMPUTE) == \
        MODEL.layers * (q_up + kv_up)
    assert "flash_attn" not in recomputed(MODEL, DEEPSEEK)


def test_core_attn_listed_is_selective_alone():
    plain = backward_ops(MODEL, recompute="selective")
    listed = backward_ops(MODEL, recompute="selective", recompute_modules=["core_attn"])
    assert plain == listed
    both = recomputed(MODEL, ["core_attn", "layernorm"])
    assert both.count("flash_attn") == MODEL.layers and both.count("ln1") == MODEL.layers


@pytest.mark.parametrize(("parallel", "message"), [
    ({"recompute_modules": ["layernorm"]}, "needs recompute = \"selective\""),
    ({"recompute": "selective", "recompute_modules": ["moe"]}, "is not modelled"),
    ({"recompute": "selective", "recompute_modules": ["shared_experts"]}, "is not modelled"),
    ({"recompute": "selective", "recompute_modules": ["norm"]}, "is not one of"),
    ({"recompute": "selective", "recompute_modules": "layernorm"}, "must be a list"),
    ({"recompute": "selective", "recompute_modules": ["moe_act", "moe_act"]}, "twice"),
    ({"exp_avg_dtype": "fp64"}, "parallel.exp_avg_dtype"),
    ({"fp8_activation_cache": 1}, "must be true or false"),
])
def test_bad_keys_are_one_line_errors(parallel: dict[str, object], message: str):
    with pytest.raises(ConfigError, match=message) as err:
        Layout(**parallel)
    assert "\n" not in str(err.value)


def test_modules_need_their_model():
    dense = ModelSpec(layers=2, hidden=H, heads=A, seq_len=S, vocab=128)
    with pytest.raises(ConfigError, match="needs latent attention"):
        check_layout(dense, Layout(recompute="selective", recompute_modules=["mla_up_proj"]))
    with pytest.raises(ConfigError, match="needs experts"):
        check_layout(dense, Layout(recompute="selective", recompute_modules=["moe_act"]))
    with pytest.raises(ConfigError, match="needs model.dtype = \"fp8\""):
        check_layout(MODEL, Layout(fp8_activation_cache=True))


def test_the_cli_refuses_a_bad_module_in_one_line_with_status_2(tmp_path: Path):
    config = Path(__file__).parents[2] / "sim" / "examples" / "deepseek-v3-2048-h800.toml"
    text = re.sub(r"(?m)^recompute_modules = .*$", 'recompute_modules = ["moe"]',
                  config.read_text())
    assert 'recompute_modules = ["moe"]' in text
    (tmp_path / "bad.toml").write_text(text)
    run = subprocess.run([sys.executable, "-m", "sim", "simulate", str(tmp_path / "bad.toml")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "parasim: error: parallel.recompute_modules: 'moe' is not modelled (modelled: "
        "core_attn, moe_act, layernorm, mla_up_proj, mlp)"]


def test_mlp_reruns_the_dense_layers_whole_mlp_and_not_the_moe_layers():
    # Megatron-Core: "mlp" checkpoints a dense layer's MLP only (an MoE layer's is "moe"); the
    # TE spec's MLP holds the pre-MLP norm (LayerNormLinear). The MoE layer's backward runs
    # first and recomputes nothing.
    assert recomputed(MODEL, ["mlp"]) == ["ln2", "fc1", "swiglu", "fc2"]
    fp8 = dataclasses.replace(MODEL, dtype="fp8")
    assert recomputed(fp8, ["mlp"]) == ["ln2", "fp8_cast", "fc1", "swiglu", "fp8_cast", "fc2"]


def test_mlp_recomputes_fc1_and_fc2_flops_once_more():
    ops = backward_ops(MODEL, recompute="selective", recompute_modules=["mlp"])
    fc1, fc2 = 2 * S * H * 2 * F, 2 * S * F * H  # SwiGLU's fused gate and up, then down
    again = {op.name: op.flops for op in ops if op.phase is Phase.RECOMPUTE}
    assert (again["fc1"], again["fc2"]) == (fc1, fc2)
    assert sum(again.values()) == fc1 + fc2


def test_mlp_with_sequence_parallelism_reruns_its_all_gather_and_reduce_scatter():
    def recompute_ops(modules: list[str]) -> list[tuple[str, str]]:
        layout = Layout(tp=2, sp=True, global_batch=1, recompute="selective",
                        recompute_modules=modules)
        return [(op.name, op.kind.value) for op in build(MODEL, layout).ops[0]
                if op.phase is Phase.RECOMPUTE]
    assert recompute_ops(["mlp"]) == [
        ("ln2", "compute"), ("tp", "all_gather"), ("fc1", "compute"), ("swiglu", "compute"),
        ("fc2", "compute"), ("tp", "reduce_scatter")]
    # the flops the fc1/fc2 GEMMs redo are 1/t of the whole layer's
    ops = backward_ops(MODEL, recompute="selective", recompute_modules=["mlp"], tp=2, sp=True)
    assert sum(op.flops for op in ops if op.phase is Phase.RECOMPUTE) == \
        (2 * S * H * 2 * F + 2 * S * F * H) / 2
