"""Parameters, units, flat order and buckets (no processes): counts equal the model's
arithmetic, shards reassemble the full tensors, buckets equal the plan builder's."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

import torch

from executor.flat import FlatLayout, Shards, rule_buckets, sized_buckets, unit_buckets
from executor.params import (
    EMBED,
    HEAD,
    init_full_unit,
    layer_unit,
    tp_shard,
    unit_numel,
    units_of_rank,
)
from traces.errors import ConfigError
from traces.layout import Layout, Schedule
from traces.model import ModelSpec
from traces.ops import OpKind
from traces.plan import build

MODEL = ModelSpec(layers=4, hidden=32, heads=4, seq_len=16, vocab=64, dtype="fp32")


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("tied", [True, False])
def test_unit_counts_equal_the_model_arithmetic(tp: int, pp: int, tied: bool) -> None:
    model = ModelSpec(layers=4, hidden=32, heads=4, seq_len=16, vocab=64, dtype="fp32",
                      tied_embeddings=tied)
    layout = Layout(tp=tp, pp=pp)
    for pp_rank in range(pp):
        flat = FlatLayout(model, layout, pp_rank)
        stages = layout.stages_of_rank(pp_rank)
        for unit in flat.units:
            want = (model.embedding_params(tp) if unit == EMBED else
                    model.head_params_on_stages(stages, tp) if unit == HEAD else
                    model.layer_params(tp))
            assert unit_numel(model, layout, unit, pp_rank) == want, unit
        assert flat.total == model.params_on_stages(stages, layout.num_stages, tp)


def test_units_in_backward_order_over_virtual_stages() -> None:
    # pp 2, vp 2, 4 layers: rank 0 holds stages 0 (L0) and 2 (L2); rank 1 stages 1 and 3.
    layout = Layout(pp=2, vp=2, schedule=Schedule.INTERLEAVED, global_batch=2)
    assert units_of_rank(MODEL, layout, 0) == [layer_unit(2), layer_unit(0), EMBED]
    assert units_of_rank(MODEL, layout, 1) == [HEAD, layer_unit(3), layer_unit(1)]


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_shards_reassemble_the_full_tensors(tp: int) -> None:
    full = init_full_unit(MODEL, layer_unit(1), seed=7)
    shards = {n: [tp_shard(MODEL, n, t, tp, r) for r in range(tp)] for n, t in full.items()}
    h, a = MODEL.hidden, MODEL.heads
    # q, k and v of each rank's heads: stack the ranks' heads back per q/k/v.
    qkv = torch.cat([s.reshape(3, a // tp, h // a, h) for s in shards["qkv.weight"]], dim=1)
    assert torch.equal(qkv.reshape(3 * h, h), full["qkv.weight"])
    assert torch.equal(torch.cat(shards["fc1.weight"]), full["fc1.weight"])
    assert torch.equal(torch.cat(shards["proj.weight"], dim=1), full["proj.weight"])
    assert torch.equal(torch.cat(shards["fc2.weight"], dim=1), full["fc2.weight"])
    for name in ("ln1.weight", "proj.bias", "fc2.bias"):
        assert all(torch.equal(s, full[name]) for s in shards[name])


def test_tied_head_copy_equals_the_word_embeddings() -> None:
    assert torch.equal(init_full_unit(MODEL, HEAD, 3)["output"],
                       init_full_unit(MODEL, EMBED, 3)["word"])
    untied = ModelSpec(layers=4, hidden=32, heads=4, seq_len=16, vocab=64, dtype="fp32",
                       tied_embeddings=False)
    assert not torch.equal(init_full_unit(untied, HEAD, 3)["output"],
                           init_full_unit(untied, EMBED, 3)["word"])


def _plan_bucket_sizes(model: ModelSpec, layout: Layout, rank: int) -> list[float]:
    plan = build(model, layout)
    kind = OpKind.ALL_REDUCE if layout.zero == 0 else OpKind.REDUCE_SCATTER
    last = layout.num_microbatches - 1
    return [op.size_bytes for op in plan.ops[rank] if op.name == "grads" and op.kind is kind
            and op.microbatch == last]


@pytest.mark.parametrize("layout", [
    Layout(dp=2, global_batch=4, bucket_bytes=30_000),
    Layout(dp=2, zero=1, global_batch=4, bucket_bytes=10_000),
    Layout(dp=2, zero=2, global_batch=2, bucket_bytes=1),
    Layout(dp=2, pp=2, vp=2, schedule=Schedule.INTERLEAVED, global_batch=8, bucket_bytes=20_000),
], ids=["ddp", "zero1", "zero2-per-unit", "interleaved"])
def test_rule_buckets_equal_the_plan_builders(layout: Layout) -> None:
    for rank in range(layout.world):
        pp_rank = layout.coords(rank).pp
        flat = FlatLayout(MODEL, layout, pp_rank)
        ours = [b.numel * 4 for b in rule_buckets(flat)]
        assert ours == _plan_bucket_sizes(MODEL, layout, rank)
        assert sized_buckets(flat, ours, 4) == rule_buckets(flat)


def test_sized_buckets_must_cut_at_unit_boundaries() -> None:
    flat = FlatLayout(MODEL, Layout(), 0)
    sizes = [flat.unit_numel(u) * 4 for u in flat.units]
    assert len(sized_buckets(flat, sizes, 4)) == len(flat.units)
    with pytest.raises(ConfigError, match="unit boundary"):
        sized_buckets(flat, [sizes[0] + 4, *sizes[1:]], 4)
    with pytest.raises(ConfigError, match="fewer than"):
        sized_buckets(flat, sizes[:-1], 4)


def test_shards_tile_each_bucket() -> None:
    flat = FlatLayout(MODEL, Layout(dp=4, global_batch=4), 0)
    buckets = unit_buckets(flat)
    slices = [Shards(buckets, 4, d).flat_slice for d in range(4)]
    covered = sorted(s for per_rank in slices for s in per_rank)
    assert covered[0][0] == 0 and covered[-1][1] == flat.total
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    with pytest.raises(ConfigError, match="not divisible by dp"):
        Shards(buckets, 3, 0)
