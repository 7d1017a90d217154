"""Folding an MoE model by identity: the experts' loads as the key (equal loads, equal
programs), expert groups that shifts do not map onto each other, and their copies by class."""

from __future__ import annotations

import pytest

import traces.plan
from traces.expert_grid import ep_group, expert_data_group, shift_closed
from traces.identity import partition_for
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe import expert_loads, uneven_experts
from traces.ops import OpKind
from traces.plan import build
from traces.symmetry import copies


def model(**edits) -> ModelSpec:
    fields = {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 256, "vocab": 4096,
              "ffn": "swiglu", "ffn_hidden": 1024, "experts": 8, "top_k": 2,
              "moe_ffn_hidden": 256, "shared_experts": 1, "dense_layers": 1, "bias": False}
    return ModelSpec(**{**fields, **edits})


@pytest.mark.parametrize(("tp", "dp", "ep", "etp", "closed"), [
    (1, 4, 2, 1, False),   # dp shift by one: EP group [0, 1] -> [1, 2], no group
    (2, 4, 4, 1, False),   # EP 4 over dp pairs: [0..3] -> [2..5]
    (2, 2, 2, 1, True),    # EP groups are the TP pairs
    (1, 64, 64, 1, True),  # the shipped DeepSeek-V3 grid: one EP group per stage
    (2, 4, 2, 2, False),   # ETP pairs are the TP pairs; EP pair [0, 2] -> [2, 4]
    (2, 2, 2, 2, True),    # ... and at DP 2 the EP pairs are the DP pairs
])
def test_which_expert_grids_the_shifts_map_onto_themselves(tp, dp, ep, etp, closed):
    layout = Layout(tp=tp, dp=dp, ep=ep, etp=etp, sp=tp > 1, global_batch=dp)
    assert shift_closed(layout) is closed


def test_an_expert_groups_copies_are_the_groups_of_its_kind_in_its_classes():
    layout = Layout(dp=4, ep=2, global_batch=4)
    fold = partition_for(model(), layout)  # balanced: one class, folded by class
    assert not fold.uniform and fold.representatives() == [0]
    assert ep_group(layout, 0) == (0, 1) and expert_data_group(layout, 0) == (0, 2)
    assert copies(layout, (0, 1), fold.rep_of) == [(2, 3)]
    assert copies(layout, (0, 2), fold.rep_of) == [(1, 3)]
    # by shifts alone the EP pair has three images, two of them no EP group
    assert copies(layout, (0, 1)) == [(1, 2), (2, 3), (3, 0)]


def test_skewed_loads_keep_the_classes_of_each_ep_coordinate_apart():
    layout = Layout(dp=8, ep=4, global_batch=8)
    fold = partition_for(model(routing_skew=1.0), layout)
    assert fold.representatives() == [0, 1, 2, 3]
    assert [fold.representative(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    # EP group [4..7] stands in the same classes as [0..3]; the expert-DP pairs hold a
    # representative each, and run themselves
    assert copies(layout, (0, 1, 2, 3), fold.rep_of) == [(4, 5, 6, 7)]
    assert copies(layout, (1, 5), fold.rep_of) == []


def test_equal_loads_mean_equal_programs_and_unequal_loads_unequal_ones():
    """On a skewed plan of every rank: two ranks of a stage have equal expert loads exactly
    when their compute ops (kernel, FLOPs, bytes, GEMM shape) are equal, so the key misses
    no difference and invents none."""
    m = model(routing_skew=1.0, capacity_factor=0.5)
    layout = Layout(tp=2, sp=True, pp=2, dp=4, ep=4, global_batch=16)
    plan = build(m, layout)

    def program(r):
        return [(op.name, op.flops, op.mem_bytes, op.gemm) for op in plan.ops[r]
                if op.kind is OpKind.COMPUTE]

    pairs = 0
    for stage in (0, 8):
        for r in range(stage, stage + 8):
            for s in range(r + 1, stage + 8):
                same = expert_loads(m, layout, r) == expert_loads(m, layout, s)
                assert same == (program(r) == program(s)), (r, s)
                pairs += same
    assert 0 < pairs < 2 * 28  # some ranks alike, not all


def test_the_key_is_read_from_the_routing_not_from_built_programs(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a rank's program was built")

    monkeypatch.setattr(traces.plan, "lower_rank", refuse)
    layout = Layout(dp=256, ep=64, global_batch=256)
    m = model(experts=256, routing_skew=1.0)
    fold = partition_for(m, layout)
    # one class per distinct load of the 64 EP coordinates (two of them happen to be equal)
    distinct = {expert_loads(m, layout, r) for r in range(64)}
    assert len(fold.representatives()) == len(distinct) == 63


def test_balanced_routing_has_no_load_key():
    assert expert_loads(model(), Layout(dp=4, ep=4, global_batch=4), 1) == ()
    assert expert_loads(model(routing_skew=1.0), Layout(dp=4, global_batch=4), 1) == ()


@pytest.mark.parametrize(("seq_len", "ep", "uneven"), [
    (256, 2, False),  # T·k = 512 routed, 64 per expert: every EP rank alike
    (255, 2, True),   # 510 = 8·63 + 6: experts 0-5 take 64, 6-7 take 63; EP rank 1 holds 6, 7
    (255, 8, True),   # one expert a rank: 64 on ranks 0-5, 63 on ranks 6-7
    (254, 4, True),   # 508 = 8·63 + 4: ranks 0-1 hold (64, 64), ranks 2-3 (63, 63)
])
def test_balanced_routing_that_splits_unevenly_sets_ep_ranks_apart(seq_len, ep, uneven):
    layout = Layout(dp=8, ep=ep, global_batch=8)
    m = model(seq_len=seq_len)
    assert uneven_experts(m, layout) is uneven
    assert (len({expert_loads(m, layout, r) for r in range(8)}) > 1) is uneven
