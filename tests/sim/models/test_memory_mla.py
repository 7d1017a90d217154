"""Activation memory of latent-attention layers (issue 19, item 2): a hand count of the
tensors one layer keeps for its backward, and a plan's TP reduction of the replicated
down-projection's partial gradients."""

from __future__ import annotations

import pytest

from sim.models.memory import activation_bytes_per_layer
from traces.layout import Layout
from traces.model import ModelSpec

S, B, H, A, F = 32, 2, 64, 4, 96
QR, KR, D, R, DV = 32, 16, 16, 8, 12


def mla(qr: int = QR) -> ModelSpec:
    return ModelSpec(layers=2, hidden=H, heads=A, seq_len=S, vocab=128, ffn="swiglu",
                     ffn_hidden=F, q_lora_rank=qr, kv_lora_rank=KR, head_dim=D,
                     qk_rope_head_dim=R, v_head_dim=DV, position="rope", norm="rmsnorm",
                     bias=False)


def hand_count(qr: int, t: int, sp: bool) -> float:
    """Every tensor a layer keeps, in bytes (2 per value, 1 per dropout-mask element)."""
    sb = S * B
    whole = sp and t or 1  # what SP splits along the sequence
    kept = [
        2 * sb * H / whole,            # ln1 input
        2 * sb * H / whole,            # mla_down input (ln1 output; q_up's too when qr = 0)
        2 * sb * (qr + KR) / whole,    # c_q, c_kv: the latent norms' input (every TP rank)
        2 * sb * (qr + KR) / whole,    # normalized c_q, c_kv: the up-projections' input
        2 * sb * A * (D + R) / t,      # Q (rotated), full size
        2 * sb * A * (D + R) / t,      # K = [k_nope | k_pe] per head, full size
        2 * sb * A * DV / t,           # V
        2 * sb * A * DV / t,           # proj input (attention output)
        1 * sb * H / whole,            # attention dropout mask
        2 * sb * H / whole,            # ln2 input
        2 * sb * H / whole,            # fc1 input
        2 * sb * F / t, 2 * sb * F / t,  # SwiGLU's gate and up
        2 * sb * F / t,                # fc2 input
        1 * sb * H / whole,            # MLP dropout mask
    ]
    return sum(kept)


@pytest.mark.parametrize("qr", [QR, 0])
@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (2, True)])
def test_activations_equal_the_hand_count(qr, t, sp):
    layout = Layout(tp=t, sp=sp, global_batch=B, micro_batch=B)
    got = activation_bytes_per_layer(mla(qr), layout)
    assert got == pytest.approx(hand_count(qr, t, sp), rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
def test_tp_sums_the_replicated_projections_partial_gradients(sp):
    """Each TP rank back-propagates only its heads through the replicated down-projection, so
    the plan all-reduces its (and the latent norms') gradients over TP, with SP's norms."""
    from traces.plan import build
    model = mla()
    layout = Layout(tp=2, sp=sp, global_batch=2, micro_batch=1)
    plan = build(model, layout)
    down = H * (QR + KR + R) + QR + KR
    want = (down + (2 * H if sp else 0)) * 2  # bf16 gradients; SP adds ln1 and ln2 (h each)
    sizes = {op.size_bytes for op in plan.ops[0]
             if op.name.startswith("sp_grads") and op.layer is not None}
    assert sizes == {want}
    # ln1's output gradient is summed after mla_down's backward, as after qkv's.
    names = [op.name for op in plan.ops[0]]
    assert "mla_down" in names and "qkv" not in names


@pytest.mark.parametrize("qr", [QR, 0])
@pytest.mark.parametrize("sp", [False, True])
def test_tp_collectives_of_a_latent_attention_layer(qr, sp):
    """One layer's TP collectives on rank 0, in order: without SP qkv's (an all-reduce of
    ln1's output gradient after mla_down's backward); with SP the latents [c_q | c_kv | k_pe]
    are gathered (b·s·(q_r + k_r + r)) instead of h, and ln1's output only for q_up when the
    query is not compressed. Then the TP sum of the replicated weights' gradients."""
    from traces.plan import build
    plan = build(mla(qr), Layout(tp=2, sp=sp, global_batch=1, micro_batch=1))
    tp, lat = S * H * 2, S * (qr + KR + R) * 2
    down = H * (qr + KR + R) + qr + KR
    fwd_b = [("fwd", "tp", tp)], [("bwd", "tp", tp)]
    if not sp:
        want = [*fwd_b[0] * 2, *fwd_b[1] * 2, ("bwd", "sp_grads", down * 2)]
    else:
        q_proj = qr == 0  # q_up gathers ln1's output (fwd), again and reduce-scatters (bwd)
        want = [("fwd", "tp_latent", lat), *[("fwd", "tp", tp)] * (4 if q_proj else 3),
                *[("bwd", "tp", tp)] * 4, ("bwd", "tp_latent", lat),
                *([("bwd", "tp", tp)] * 2 if q_proj else []), ("bwd", "tp_latent", lat),
                ("bwd", "sp_grads", (down + 2 * H) * 2)]
    got = [(str(o.phase), o.name, o.size_bytes) for o in plan.ops[0]
           if o.layer == 0 and o.microbatch == 0 and o.kind != "compute"]
    assert got == want
