"""The step's end in the executor: the global gradient norm, the clip and fp16's found-inf
check equal torch.nn.utils.clip_grad_norm_ on the single-process reference, and the norm
counts every parameter of the model once (executor.clip)."""

from __future__ import annotations

import dataclasses
import math

import pytest

pytest.importorskip("torch")  # the executor runs on torch

import torch

from executor.clip import counted_mask
from executor.comm import Comm
from executor.flat import FlatLayout
from executor.groups import Groups
from executor.params import HEAD
from executor.reference import train
from executor.runtime import RankRuntime
from tests.executor.checks import check_training
from tests.executor.drive import Step
from tests.executor.workers import ADAMW, OPTIONS, SMALL, segments
from traces.layout import Layout
from traces.model import ModelSpec
from traces.purpose import Kernel

MODEL = ModelSpec(**SMALL)  # type: ignore[arg-type]


def _run(layout: Layout, clip: float, steps: int = 2) -> tuple[RankRuntime, dict]:
    rt = RankRuntime(MODEL, layout, 0, Comm(Groups(0, {})),
                     dataclasses.replace(OPTIONS, clip_grad=clip), torch.device("cpu"))
    losses, grads, norms = [], None, []
    for _ in range(steps):
        step = Step(rt)
        losses.append(step.run())
        grads = grads if grads is not None else step.reduced_grads
        norms.append(rt.grad_norm)
    params = {u: rt.unit_params(u) for u in rt.flat.units}
    return rt, {"losses": losses, "grads": grads, "segments": segments(rt), "params": params,
                "coords": layout.coords(0), "norms": norms}


@pytest.mark.parametrize("clip", [0.05, 1e6])  # clipped hard every step; never clipped
def test_clipped_training_equals_the_reference_with_clip_grad_norm(clip: float) -> None:
    layout = Layout(micro_batch=2, global_batch=4)
    _, result = _run(layout, clip)
    ref = train(MODEL, layout.global_batch, 2, OPTIONS.seed, ADAMW, clip_grad=clip)
    check_training(MODEL, layout, [result], ref)
    assert result["norms"] == pytest.approx(ref.grad_norms, rel=1e-5)
    assert min(ref.grad_norms) > 10 * 0.05  # the hard clip really scales every step


def test_a_hard_clip_changes_the_parameters() -> None:
    """Not vacuous: clipping at 0.05 trains differently from not clipping."""
    layout = Layout(micro_batch=2, global_batch=4)
    _, hard = _run(layout, 0.05)
    _, free = _run(layout, 1e6)
    unit = next(iter(hard["params"]))
    name = next(iter(hard["params"][unit]))
    assert not torch.allclose(hard["params"][unit][name], free["params"][unit][name])


def test_the_norm_is_the_square_root_of_the_summed_squares_of_the_gradients() -> None:
    layout = Layout(micro_batch=2, global_batch=4)
    rt, _ = _run(layout, 1e6, steps=1)
    grads = [g.clone() for g in rt.grads.optimizer_grads()]  # zeroed after the step
    assert all(float(g.abs().sum()) == 0.0 for g in grads)
    torch.manual_seed(0)
    for g in rt.grads.optimizer_grads():
        g.copy_(torch.randn_like(g))
    expected = math.sqrt(sum(float(g.double().square().sum()) for g in rt.grads.optimizer_grads()))
    rt.step_kernel(Kernel.GRAD_NORM)
    rt.step_kernel(Kernel.GRAD_CLIP)  # clip 1e6: the factor is 1
    assert rt.grad_norm == pytest.approx(expected, rel=1e-6)


def test_fp16_found_inf_skips_the_step() -> None:
    model = dataclasses.replace(MODEL, dtype="fp16")
    rt = RankRuntime(model, Layout(global_batch=1), 0, Comm(Groups(0, {})), OPTIONS,
                     torch.device("cpu"))
    before = [p.clone() for p in rt.params.optimizer_params()]
    rt.grads.optimizer_grads()[0][0] = float("inf")
    rt.step_kernel(Kernel.GRAD_UNSCALE)
    assert rt.clip.skip
    rt.optimizer_step()
    assert all(torch.equal(a, b) for a, b in zip(before, rt.params.optimizer_params()))
    assert not rt.clip.skip  # the flag is per step


def test_the_norm_counts_tp_replicated_parameters_and_tied_copies_once() -> None:
    tp = Layout(tp=2, global_batch=1)
    flat = FlatLayout(MODEL, tp, 0)
    replicated = sum(b - a for a, b in flat.replicated_ranges())
    assert replicated > 0
    assert int(counted_mask(flat, 0, True).sum()) == flat.total
    assert int(counted_mask(flat, 1, True).sum()) == flat.total - replicated
    pp = Layout(pp=2, global_batch=2)
    last = FlatLayout(MODEL, pp, 1)  # holds the tied output layer: a copy of the embedding
    a, b = last.param_range[(HEAD, "output")]
    mask = counted_mask(last, 0, True)
    assert not mask[a:b].any() and int(mask.sum()) == last.total - (b - a)
    assert int(counted_mask(last, 0, False).sum()) == last.total  # untied: its own weights
