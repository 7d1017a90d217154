"""The memory model under reshard_after_forward and grad_sync (traces.fsdp): the gathered
parameters it holds are the plan's all-gathers of a pass, byte for byte; gradients reduced
once per step are held whole (docs/memory-model.md)."""

from __future__ import annotations

import pytest

from sim.models.memory import (
    gathered_params,
    memory_by_pp_rank,
    memory_timeline,
    zero3_working_bytes,
)
from traces.layout import Layout
from traces.model import ModelSpec
from traces.pipeline import layout_schedule
from traces.plan import build
from traces.purpose import UnitGather

SMALL = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128)


def zero3(**options: object) -> Layout:
    return Layout(dp=2, zero=3, global_batch=8, **options)  # type: ignore[arg-type]


def first_pass_gathers(layout: Layout, rank: int) -> float:
    """Bytes the plan all-gathers for micro-batch 0's forwards on `rank`: every unit once."""
    return sum(op.size_bytes for op in build(SMALL, layout).ops[rank]
               if isinstance(op.purpose, UnitGather) and op.microbatch == 0
               and op.phase == "fwd")


@pytest.mark.parametrize("options", [dict(), dict(pp=2), dict(tp=2, pp=2, vp=2,
                                                              schedule="interleaved")],
                         ids=["pp1", "pp2", "tp2-interleaved"])
def test_no_reshard_holds_every_units_gathered_parameters(options: dict) -> None:
    """The peak rises by the units' full parameters held, less the two layers the default's
    window holds: (all gathered) - 2 x 2 x layer_params(t), exactly."""
    held, window = zero3(reshard_after_forward=False, **options), zero3(**options)
    for pp_rank, (a, b) in enumerate(zip(memory_by_pp_rank(SMALL, held),
                                         memory_by_pp_rank(SMALL, window))):
        gathered = first_pass_gathers(held, held.rank(pp=pp_rank))
        assert gathered == SMALL.dtype_bytes * gathered_params(SMALL, held, pp_rank) > 0
        increase = gathered - 2 * 2 * SMALL.layer_params(held.tp)
        assert a.total_bytes - b.total_bytes == increase
        assert a.working_bytes - b.working_bytes == increase
        assert (a.params_bytes, a.grads_bytes, a.activations_bytes) == \
            (b.params_bytes, b.grads_bytes, b.activations_bytes)


def test_the_timeline_peaks_at_the_same_bytes() -> None:
    layout = zero3(reshard_after_forward=False)
    actions = layout_schedule(layout)[0]
    timed = [(action, float(i), i + 0.5) for i, action in enumerate(actions)]
    peak = max(b for _, b in memory_timeline(SMALL, layout, 0, timed))
    assert peak == memory_by_pp_rank(SMALL, layout)[0].total_bytes


def test_zero3_step_holds_full_gradients() -> None:
    """Unsharded gradients accumulated over the micro-batches: 2Ψ instead of 2Ψ/N, and no
    separate per-layer buffer before a reduce-scatter."""
    step, every = memory_by_pp_rank(SMALL, zero3(grad_sync="step"))[0], \
        memory_by_pp_rank(SMALL, zero3())[0]
    psi = gathered_params(SMALL, zero3(), 0)
    assert every.grads_bytes == 2 * psi / 2
    assert step.grads_bytes == 2 * psi
    assert every.working_bytes - step.working_bytes == 2 * SMALL.layer_params(1)
    assert (step.params_bytes, step.optimizer_bytes) == (every.params_bytes, every.optimizer_bytes)


def test_zero3_both_keys_hold_full_gradients_and_every_unit() -> None:
    both = memory_by_pp_rank(SMALL, zero3(grad_sync="step", reshard_after_forward=False))[0]
    psi = gathered_params(SMALL, zero3(), 0)
    logits = 4 * SMALL.seq_len * SMALL.vocab  # fp32, one micro-batch, on the last stage
    assert both.working_bytes == 2 * psi + logits  # every unit gathered, no layer's grads
    assert both.grads_bytes == 2 * psi


@pytest.mark.parametrize("fp32", [False, True])
def test_zero2_step_holds_zero1s_full_gradient_buffer(fp32: bool) -> None:
    """Megatron-Core's distributed optimizer: a full gradient buffer, ZeRO-1's states."""
    base = dict(dp=2, global_batch=8, fp32_main_grads=fp32)
    one = memory_by_pp_rank(SMALL, Layout(zero=1, **base))[0]  # type: ignore[arg-type]
    two = memory_by_pp_rank(SMALL, Layout(zero=2, grad_sync="step",  # type: ignore[arg-type]
                                          **base))[0]
    sharded = memory_by_pp_rank(SMALL, Layout(zero=2, **base))[0]  # type: ignore[arg-type]
    assert two == one
    assert two.grads_bytes == 2 * sharded.grads_bytes == (4 if fp32 else 2) * \
        gathered_params(SMALL, zero3(), 0)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_zero3_window_is_in_the_dtype_the_plan_gathers(dtype: str) -> None:
    """ZeRO-3's window, two layers gathered and one layer's gradients, is in the model's
    dtype: the plan's per-layer all-gather of a layer's parameters, 3 of them (an fp32 model
    was counted at 2 bytes an element)."""
    model = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, dtype=dtype)
    layout = zero3()
    layer = model.layer_params(1) * model.dtype_bytes
    gathers = {op.size_bytes for op in build(model, layout).ops[0]
               if isinstance(op.purpose, UnitGather) and op.layer == 1}
    assert gathers == {layer}
    assert zero3_working_bytes(model, layout, 0) == 3 * layer
