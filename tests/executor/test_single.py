"""One process, no communication: the runtime's kernels, run one by one in the doc's order,
train exactly as the single-process reference; recomputation changes memory, not numbers."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

import torch

from executor.comm import Comm
from executor.groups import Groups
from executor.memory import MemoryMeter
from executor.optim import AdamW, AdamWConfig
from executor.options import RunOptions
from executor.reference import train
from executor.runtime import RankRuntime
from tests.executor.checks import check_training
from tests.executor.drive import Step
from tests.executor.workers import ADAMW, MLA, OPTIONS, QWEN3, SMALL, segments
from traces.layout import Layout, Recompute
from traces.model import ModelSpec


def _runtime(layout: Layout, options: RunOptions = OPTIONS, **model: object) -> RankRuntime:
    spec = ModelSpec(**{**SMALL, **model})  # type: ignore[arg-type]
    return RankRuntime(spec, layout, 0, Comm(Groups(0, {})), options, torch.device("cpu"))


def _train(rt: RankRuntime, steps: int = 2) -> dict:
    losses, grads = [], None
    for _ in range(steps):
        step = Step(rt)
        losses.append(step.run())
        grads = grads if grads is not None else step.reduced_grads
    params = {u: rt.unit_params(u) for u in rt.flat.units}
    return {"losses": losses, "grads": grads, "segments": segments(rt), "params": params,
            "coords": rt.layout.coords(0)}


@pytest.mark.parametrize("attention", ["flash", "unfused"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_kernels_train_as_the_reference(attention: str, recompute: str) -> None:
    layout = Layout(micro_batch=2, global_batch=4, recompute=Recompute(recompute))
    rt = _runtime(layout, attention=attention)
    result = _train(rt)
    run = train(rt.model, layout.global_batch, 2, OPTIONS.seed, ADAMW)
    worst = check_training(rt.model, layout, [result], run)
    assert worst["loss"] < 1e-6


@pytest.mark.parametrize(("attention", "recompute", "q_lora"), [
    ("flash", "none", 16), ("unfused", "selective", 16), ("flash", "full", 0)])
def test_latent_attention_trains_as_the_reference(attention: str, recompute: str,
                                                   q_lora: int) -> None:
    """MLA (issue 19): the executor's mla_down, latent_norm, q_up, kv_up and rope kernels
    against the reference's own MLA block, fp32, two steps."""
    layout = Layout(micro_batch=2, global_batch=4, recompute=Recompute(recompute))
    rt = _runtime(layout, **{**MLA, "q_lora_rank": q_lora, "attention": attention})
    run = train(rt.model, layout.global_batch, 2, OPTIONS.seed, ADAMW)
    worst = check_training(rt.model, layout, [_train(rt)], run)
    assert worst["loss"] < 1e-6


@pytest.mark.parametrize(("attention", "recompute", "norm"), [
    ("flash", "none", "rmsnorm"), ("unfused", "selective", "rmsnorm"),
    ("flash", "full", "layernorm")])
def test_qwen3_heads_train_as_the_reference(attention: str, recompute: str, norm: str) -> None:
    """Issue 32: heads of their own width (a·d = 48 on hidden 32) and qk_norm, RMSNorm or
    LayerNorm with its biases: the executor's qkv, qk_norm, rope, core and proj against the
    reference's own block, fp32, two steps."""
    layout = Layout(micro_batch=2, global_batch=4, recompute=Recompute(recompute))
    rt = _runtime(layout, **{**QWEN3, "attention": attention, "norm": norm})
    assert rt.model.q_width == 48 != rt.model.hidden
    run = train(rt.model, layout.global_batch, 2, OPTIONS.seed, ADAMW)
    worst = check_training(rt.model, layout, [_train(rt)], run)
    assert worst["loss"] < 1e-6


@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_a_model_without_dropout_trains_as_the_reference(attention: str) -> None:
    """dropout = 0: the plan runs no attn_dropout (softmax writes what av reads) and the
    kernels still train exactly as the reference, recomputing the core selectively."""
    layout = Layout(micro_batch=2, global_batch=4, recompute=Recompute.SELECTIVE)
    rt = _runtime(layout, attention=attention, dropout=0.0)
    run = train(rt.model, layout.global_batch, 2, OPTIONS.seed, ADAMW)
    worst = check_training(rt.model, layout, [_train(rt)], run)
    assert worst["loss"] < 1e-6


def test_untied_output_layer_trains_as_the_reference() -> None:
    layout = Layout(micro_batch=1, global_batch=2)
    rt = _runtime(layout, tied_embeddings=False)
    run = train(rt.model, layout.global_batch, 2, OPTIONS.seed, ADAMW)
    check_training(rt.model, layout, [_train(rt)], run)


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recomputation_draws_the_same_dropout_masks(recompute: str) -> None:
    """With dropout on, recomputed forwards must see the masks of the first forward: the
    gradients equal those without recomputation, bit for bit."""
    options = RunOptions(dropout=0.1, adamw=ADAMW)
    grads = {}
    for mode in ("none", recompute):
        for attention in ("flash", "unfused"):
            rt = _runtime(Layout(micro_batch=2, global_batch=2, recompute=Recompute(mode)), options,
                          attention=attention)
            step = Step(rt)
            step.run()
            grads[(mode, attention)] = step.reduced_grads[0]
    for attention in ("flash", "unfused"):
        assert torch.equal(grads[("none", attention)], grads[(recompute, attention)])
    # ... and dropout is on: the step differs from one without it.
    rt = _runtime(Layout(micro_batch=2, global_batch=2))
    step = Step(rt)
    step.run()
    assert not torch.allclose(step.reduced_grads[0], grads[("none", "flash")])


def _activation_peak(recompute: str, attention: str = "flash") -> tuple[int, int]:
    rt = _runtime(Layout(micro_batch=2, global_batch=4, recompute=Recompute(recompute)),
                  attention=attention, layers=4, seq_len=32)
    base = rt.meter.live_bytes
    rt.meter.reset_peak()
    Step(rt).run()
    return rt.meter.peak_by_category["activations"], rt.meter.live_bytes - base


def test_memory_meter_sees_recomputation_and_attention_scores() -> None:
    none, left = _activation_peak("none")
    assert left == 0, "every saved activation is released by the end of the step"
    selective, _ = _activation_peak("selective")
    full, _ = _activation_peak("full")
    unfused, _ = _activation_peak("none", "unfused")
    assert full < selective <= none < unfused
    # Unfused attention keeps the b*a*s^2 scores: scores, probabilities and dropped-out
    # probabilities, 2*4*32*32 fp32 values each, per layer in flight, at least.
    assert unfused - none >= 4 * (2 * 4 * 32 * 32 * 4)


def test_adamw_equals_torch_adamw() -> None:
    gen = torch.Generator().manual_seed(0)
    config = AdamWConfig(lr=0.01, weight_decay=0.1)
    ours = torch.randn(100, generator=gen)
    theirs = ours.clone().requires_grad_()
    opt = AdamW([ours], config)
    ref = torch.optim.AdamW([theirs], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=False)
    for _ in range(3):
        grad = torch.randn(100, generator=gen)
        opt.step([grad])
        theirs.grad = grad.clone()
        ref.step()
    assert torch.equal(ours, theirs.detach())


def test_meter_counts_each_storage_once() -> None:
    meter = MemoryMeter()
    t = torch.zeros(100)
    a, b = meter.hold(t, "activations"), meter.hold(t[10:], "activations")
    assert meter.live_bytes == 400 and a == b
    meter.drop(a)
    assert meter.live_bytes == 400
    meter.drop(b)
    assert meter.live_bytes == 0 and meter.peak_bytes == 400
    meter.exclude(t)
    assert meter.hold(t, "activations") == 0 and meter.hold(t, "params") != 0
