"""reshard_after_forward and grad_sync in the plan (traces.fsdp, traces.plan.data): ZeRO-3's
gathers counted per unit, pass and micro-batch; reductions counted per bucket (ZeRO 2) and
unit (ZeRO 3) per step; the defaults' plans equal those of layouts that state them; the keys
round-trip a trace header and stay out of it at their defaults."""

from __future__ import annotations

from collections import Counter

import pytest

from traces.fsdp import GradSync
from traces.header_json import meta_from_json, meta_to_json
from traces.io import VERSION
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Op, Phase
from traces.plan import build
from traces.plan.data import gradient_buckets
from traces.plan.nodes import RankContext
from traces.purpose import GradBucket, SpGrads, UnitGather, UnitGradReduce

SMALL = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128)
M = 4  # micro-batches: global_batch 8 over dp 2


def zero3(**options: object) -> Layout:
    return Layout(dp=2, zero=3, global_batch=2 * M, **options)  # type: ignore[arg-type]


def gathers(ops: tuple[Op, ...]) -> Counter[tuple[str, Phase | None, int | None]]:
    """ZeRO-3 all-gathers by (unit, phase, micro-batch)."""
    return Counter((str(op.purpose.unit), op.phase, op.microbatch) for op in ops
                   if isinstance(op.purpose, UnitGather))


def units(ops: tuple[Op, ...]) -> set[str]:
    return {str(op.purpose.unit) for op in ops if isinstance(op.purpose, UnitGather)}


def test_default_gathers_each_unit_before_every_pass() -> None:
    ops = build(SMALL, zero3()).ops[0]
    assert set(gathers(ops).values()) == {1}
    assert len(gathers(ops)) == len(units(ops)) * 2 * M  # 6 units x (fwd + bwd) x 4


def test_no_reshard_gathers_each_unit_once_per_microbatch_before_its_forward() -> None:
    ops = build(SMALL, zero3(reshard_after_forward=False)).ops[0]
    expected = {(u, Phase.FWD, mb) for u in units(ops) for mb in range(M)}
    assert gathers(ops) == Counter(expected)  # none in backward: held since the forward


def test_no_reshard_under_gpipe_regathers_in_the_backwards_after_the_first() -> None:
    """F0..F3 then B0..B3 at pp 1: held from F0 (F1-F3 find it gathered) to B0's end, freed;
    B1, B2, B3 each gather it again (FSDP2's pre-backward unshard of a resharded unit)."""
    ops = build(SMALL, zero3(reshard_after_forward=False, schedule="gpipe")).ops[0]
    expected = {(u, Phase.FWD, 0) for u in units(ops)} | \
        {(u, Phase.BWD, mb) for u in units(ops) for mb in range(1, M)}
    assert gathers(ops) == Counter(expected)


@pytest.mark.parametrize("options", [dict(pp=2), dict(pp=2, schedule="gpipe"),
                                     dict(pp=2, vp=2, schedule="interleaved")],
                         ids=["1f1b", "gpipe", "interleaved"])
def test_no_reshard_under_a_pipeline_gathers_each_unit_once_per_step(options: dict) -> None:
    """PipelineStage keeps FSDP2 units unsharded after every backward but the last: one
    gather per unit per step, before its first forward (micro-batch 0)."""
    layout = zero3(reshard_after_forward=False, **options)
    plan = build(SMALL, layout)
    for rank, ops in plan.ops.items():
        held = units(ops)
        assert held and gathers(ops) == Counter({(u, Phase.FWD, 0) for u in held}), rank
        default = gathers(build(SMALL, zero3(**options)).ops[rank])
        assert sum(default.values()) == 2 * M * len(held)


def reductions(ops: tuple[Op, ...], kind: type) -> Counter[int | None]:
    """Reductions of purpose `kind` by micro-batch."""
    return Counter(op.microbatch for op in ops if isinstance(op.purpose, kind))


def test_zero3_step_reduce_scatters_each_unit_once_in_the_last_microbatch() -> None:
    every = build(SMALL, zero3()).ops[0]
    once = build(SMALL, zero3(grad_sync="step")).ops[0]
    n = len(units(every))
    assert reductions(every, UnitGradReduce) == Counter({mb: n for mb in range(M)})
    assert reductions(once, UnitGradReduce) == Counter({M - 1: n})


def test_zero3_step_sums_sp_gradients_once_too() -> None:
    layout = Layout(tp=2, sp=True, dp=2, zero=3, global_batch=2 * M, grad_sync="step")
    ops = build(SMALL, layout).ops[0]
    assert set(reductions(ops, SpGrads)) == {M - 1}
    assert sum(reductions(ops, SpGrads).values()) == len(units(ops))  # each unit once


@pytest.mark.parametrize("overlap", [True, False])
def test_zero2_step_reduce_scatters_each_bucket_once_per_step(overlap: bool) -> None:
    base = dict(dp=2, zero=2, global_batch=2 * M, bucket_bytes=20_000,
                overlap_grad_reduce=overlap)
    layout = Layout(**base)  # type: ignore[arg-type]
    buckets = len(gradient_buckets(RankContext(model=SMALL, layout=layout, rank=0)))
    assert buckets == 5
    every = build(SMALL, layout).ops[0]
    once = build(SMALL, Layout(**base, grad_sync="step")).ops[0]  # type: ignore[arg-type]
    assert reductions(every, GradBucket) == Counter({mb: buckets for mb in range(M)})
    assert reductions(once, GradBucket) == Counter({M - 1: buckets})
    sizes = [op.size_bytes for op in once if isinstance(op.purpose, GradBucket)]
    assert sizes == [op.size_bytes for op in every
                     if isinstance(op.purpose, GradBucket) and op.microbatch == M - 1]


def test_zero2_step_is_zero1s_communication() -> None:
    """Megatron-Core's distributed optimizer: ZeRO-1's reduce-scatters and gathers."""
    one = build(SMALL, Layout(dp=2, zero=1, global_batch=2 * M, bucket_bytes=20_000))
    two = build(SMALL, Layout(dp=2, zero=2, global_batch=2 * M, bucket_bytes=20_000,
                              grad_sync="step"))
    assert [(o.kind, o.size_bytes, o.purpose) for o in one.ops[0] if o.kind != "compute"] == \
        [(o.kind, o.size_bytes, o.purpose) for o in two.ops[0] if o.kind != "compute"]


@pytest.mark.parametrize(("stated", "implied"), [
    (dict(zero=3, reshard_after_forward=True, grad_sync="microbatch"), dict(zero=3)),
    (dict(zero=2, grad_sync="microbatch"), dict(zero=2)),
    (dict(zero=1, grad_sync="step"), dict(zero=1)),
    (dict(zero=0, grad_sync="step"), dict(zero=0)),
])
def test_stated_defaults_are_the_same_layout_and_plan(stated: dict, implied: dict) -> None:
    a = Layout(dp=2, global_batch=8, **stated)
    b = Layout(dp=2, global_batch=8, **implied)
    assert a == b and a.to_dict() == b.to_dict()
    assert "grad_sync" not in a.to_dict() and "reshard_after_forward" not in a.to_dict()
    assert build(SMALL, a).ops == build(SMALL, b).ops


def test_the_effective_sync_follows_the_stage() -> None:
    assert [Layout(dp=2, zero=z, global_batch=2).sync for z in range(4)] == [
        GradSync.STEP, GradSync.STEP, GradSync.MICROBATCH, GradSync.MICROBATCH]


def test_the_keys_round_trip_a_trace_header() -> None:
    layout = zero3(reshard_after_forward=False, grad_sync="step")
    meta = build(SMALL, layout).meta
    text = meta_to_json(meta)
    assert text["layout"]["reshard_after_forward"] is False
    assert text["layout"]["grad_sync"] == "step"
    assert meta_from_json(text, VERSION).layout == layout
