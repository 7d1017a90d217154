"""`model.dropout`: a dropout draws one random number per element and keeps a 1-byte mask;
dropout = 0 draws none, keeps none and runs no attention dropout. The draws are timed on the
integer lanes (Philox4x32-10, 20 instructions a draw), beside the kernel's bytes."""

from __future__ import annotations

import math

import pytest

from sim.config import experiment_from_dict
from sim.models.compute import PHILOX_INT_OPS_PER_DRAW, ComputeModel
from sim.models.memory import activation_bytes_per_layer, activation_terms
from sim.profile import default_profile
from topology.presets import A100_80GB, TPU_V4
from traces.errors import ConfigError
from traces.kernels import embedding_kernels, layer_kernels
from traces.layout import Layout, Recompute
from traces.model import ModelSpec
from traces.ops import Phase
from traces.plan import build
from traces.purpose import Kernel

S, H, A, B, T = 1024, 1024, 16, 2, 2
GPT = dict(layers=2, hidden=H, heads=A, seq_len=S, vocab=1024)


def _by_name(model: ModelSpec, sp: bool = False) -> dict[Kernel, object]:
    return {k.name: k for k in layer_kernels(model, B, T, sp) + embedding_kernels(model, B, T, sp)}


def test_each_dropout_draws_a_number_per_element_and_keeps_a_byte():
    k = _by_name(ModelSpec(**GPT, attention="unfused"), sp=True)
    r = S // T  # SP: the bias-dropout-adds and the position dropout hold s/t tokens
    assert k[Kernel.ATTN_DROPOUT].draws == B * A // T * S * S
    assert k[Kernel.ATTN_DROPOUT].mem_bytes == B * A // T * S * S * (2 * 2 + 1)
    for name in (Kernel.BDA1, Kernel.BDA2):
        assert k[name].draws == B * r * H and k[name].bwd_draws == 0  # backward reads the mask
        assert k[name].mem_bytes == B * r * H * (3 * 2 + 1)
    assert k[Kernel.POS_EMBED].draws == B * r * H
    assert all(k[n].draws == 0 for n in (Kernel.QKV, Kernel.SOFTMAX, Kernel.LN1, Kernel.GELU))


def test_flash_draws_each_causal_score_forward_and_again_backward():
    flash = _by_name(ModelSpec(**GPT))[Kernel.FLASH_ATTN]
    assert flash.draws == flash.bwd_draws == B * A // T * S * (S + 1) / 2


def test_no_dropout_no_draws_no_masks_no_attention_dropout():
    base, none = (ModelSpec(**GPT, attention="unfused", dropout=p) for p in (0.1, 0.0))
    k0, k1 = _by_name(base), _by_name(none)
    assert Kernel.ATTN_DROPOUT in k0 and Kernel.ATTN_DROPOUT not in k1
    assert all(k.draws == k.bwd_draws == 0 for k in k1.values())
    n = B * S * H  # no SP: every token
    assert k1[Kernel.BDA1].mem_bytes == n * 3 * 2 and k1[Kernel.BDA1].bwd_bytes == n * (2 + 1) * 2
    assert k0[Kernel.BDA1].mem_bytes - k1[Kernel.BDA1].mem_bytes == n  # the 1-byte mask
    assert sum(k.flops for k in k0.values()) == sum(k.flops for k in k1.values())
    flash = _by_name(ModelSpec(**GPT, dropout=0.0))[Kernel.FLASH_ATTN]
    assert flash.draws == flash.bwd_draws == 0


def test_the_plan_carries_the_draws_and_recomputation_draws_again():
    model = ModelSpec(**GPT, attention="unfused")
    plan = build(model, Layout(tp=1, micro_batch=1, global_batch=1, recompute=Recompute.FULL))
    ops = [op for op in plan.ops[0] if op.name == "attn_dropout"]
    F, R, W = Phase.FWD, Phase.RECOMPUTE, Phase.BWD  # two layers: forwards, then backwards
    assert [op.phase for op in ops] == [F, F, R, W, R, W]
    assert [op.draws for op in ops] == [A * S * S] * 3 + [0, A * S * S, 0]
    quiet = build(ModelSpec(**GPT, attention="unfused", dropout=0.0), Layout(global_batch=1))
    assert not any(op.draws for op in quiet.ops[0])
    assert not any(op.name == "attn_dropout" for op in quiet.ops[0])


def test_draws_cost_their_integer_time_beside_the_bytes():
    """(t_int^p + t_mem^p)^(1/p): 20 instructions a draw on 108 SMs x 64 lanes at 1305 MHz."""
    profile = default_profile(A100_80GB)
    c = profile.compute
    model = ComputeModel(A100_80GB, profile)
    n, nbytes = 1e8, 7e8
    memory = nbytes / (A100_80GB.hbm_bandwidth_Bps * c.memory_efficiency)
    integer = n * PHILOX_INT_OPS_PER_DRAW / (108 * 64 * 1305e6)
    p = c.roofline_exponent
    expected = (memory ** p + integer ** p) ** (1 / p) + c.launch_overhead_s
    got = model.kernel_time("bda1", 0.0, nbytes, draws=n)
    assert got == pytest.approx(expected, rel=1e-12)
    assert got > model.kernel_time("bda1", 0.0, nbytes)
    tpu = ComputeModel(TPU_V4, profile)  # no integer-lane figure: draws cost nothing
    assert tpu.kernel_time("bda1", 0.0, nbytes, draws=n) == tpu.kernel_time("bda1", 0.0, nbytes)


def test_memory_without_dropout_loses_the_masks():
    """Korthikanti's 34sbh + 5as²b less the two 1-byte masks (2sbh) and, unfused, the
    softmax-dropout mask and the dropped-out copy (3as²b): 32sbh + 2as²b."""
    gpt, none = ModelSpec(**GPT, attention="unfused"), \
        ModelSpec(**GPT, attention="unfused", dropout=0.0)
    assert activation_terms(gpt) == (10, 24) and activation_terms(none) == (8, 24)
    layout = Layout(micro_batch=1, global_batch=1)
    sbh = S * H
    assert activation_bytes_per_layer(gpt, layout) == sbh * (34 + 5 * A * S / H)
    assert activation_bytes_per_layer(none, layout) == sbh * (32 + 2 * A * S / H)


@pytest.mark.parametrize("bad", [1, 1.0, -0.1, math.nan, math.inf, True, "0.1"])
def test_a_dropout_that_is_not_a_probability_is_refused(bad):
    with pytest.raises(ConfigError, match=r"model\.dropout: .* must be a probability"):
        experiment_from_dict({"model": {**GPT, "dropout": bad}, "parallel": {"global_batch": 1},
                              "cluster": {"preset": "dgx-a100", "nodes": 1,
                                          "gpus_per_node": 1}})

