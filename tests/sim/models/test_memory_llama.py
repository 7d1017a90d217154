"""Activation memory of Llama-style layers (issue 18): GQA and SwiGLU equal a hand count of
the tensors one layer keeps for its backward (Korthikanti et al. 2022's accounting)."""

from __future__ import annotations

import pytest

from sim.models.memory import activation_bytes_per_layer, activation_terms
from traces.layout import Layout
from traces.model import ModelSpec

S, B, H, A, F = 32, 2, 64, 4, 96
D = H // A


def llama(kv: int, ffn: str = "swiglu") -> ModelSpec:
    """SwiGLU of width F; GeLU of the paper's 4h (the memory model counts GeLU at 4h)."""
    return ModelSpec(layers=2, hidden=H, heads=A, kv_heads=kv, seq_len=S, vocab=128, ffn=ffn,
                     ffn_hidden=F if ffn == "swiglu" else 4 * H, norm="rmsnorm", position="rope",
                     bias=False)


def hand_count(kv: int, t: int, sp: bool, ffn: str) -> float:
    """Every tensor a layer keeps, in bytes (2 per value, 1 per dropout-mask element)."""
    sb = S * B
    f = F if ffn == "swiglu" else 4 * H
    whole = sp and t or 1  # what SP splits along the sequence besides what TP splits
    kept = [
        2 * sb * H / whole,            # ln1 input (the residual stream)
        2 * sb * H / whole,            # qkv input (ln1 output; gathered again under SP)
        2 * sb * A * D / t,            # Q (rotated)
        2 * sb * kv * D / t,           # K (rotated)
        2 * sb * kv * D / t,           # V
        2 * sb * H / t,                # proj input (attention output)
        1 * sb * H / whole,            # attention dropout mask
        2 * sb * H / whole,            # ln2 input
        2 * sb * H / whole,            # fc1 input
        *([2 * sb * f / t] * (2 if ffn == "swiglu" else 1)),  # activation input (gate, up)
        2 * sb * f / t,                # fc2 input
        1 * sb * H / whole,            # MLP dropout mask
    ]
    return sum(kept)


@pytest.mark.parametrize("kv", [1, 2, A])
@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (2, True)])
@pytest.mark.parametrize("ffn", ["swiglu", "gelu"])
def test_activations_equal_the_hand_count(kv, t, sp, ffn):
    if kv % t:
        pytest.skip("TP must divide kv_heads")
    layout = Layout(tp=t, sp=sp, global_batch=B, micro_batch=B)
    got = activation_bytes_per_layer(llama(kv, ffn), layout)
    assert got == pytest.approx(hand_count(kv, t, sp, ffn), rel=1e-12)


def test_gpt_is_34_and_llama_3_70b_35_5():
    gpt = ModelSpec(layers=1, hidden=H, heads=A, seq_len=S, vocab=128)
    assert sum(activation_terms(gpt)) == 34
    llama70 = ModelSpec(layers=80, hidden=8192, heads=64, kv_heads=8, seq_len=8192, vocab=128256,
                        ffn="swiglu", ffn_hidden=28672)
    assert activation_terms(llama70) == (10, 25.5)  # 4 + 4/8 + 6 * 3.5
