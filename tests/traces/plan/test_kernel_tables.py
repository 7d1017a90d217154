"""Each rank's kernel table is made once per plan: the op-cap check counts from it and
lowering builds from the same (`traces.plan.compute.KernelTables`), with the cap still checked
first and a refused plan keeping none."""

from __future__ import annotations

from collections import Counter

import pytest

import traces.plan
import traces.plan.compute as compute
from traces.layout import Layout
from traces.model import ModelSpec
from traces.plan import build, layout_schedule, lower_rank
from traces.plan.compute import KernelTables

# skewed routing over EP 4: every EP rank's experts carry their own loads, so each pipeline
# rank has several stand-ins (and the DP copies beyond EP share them)
MODEL = ModelSpec(layers=4, hidden=512, heads=8, seq_len=256, vocab=4096, ffn="swiglu",
                  ffn_hidden=1024, experts=8, top_k=2, moe_ffn_hidden=256, shared_experts=1,
                  dense_layers=1, bias=False, routing_skew=1.0)
LAYOUT = Layout(pp=2, dp=8, ep=4, global_batch=16)


@pytest.fixture
def made(monkeypatch) -> Counter[int]:
    """How many times each rank's kernel table is made."""
    counts: Counter[int] = Counter()
    original = compute._StageKernels

    class Counted(original):  # type: ignore[misc, valid-type]
        def __init__(self, ctx, rows=None):
            counts[ctx.rank] += 1
            super().__init__(ctx, rows)

    monkeypatch.setattr(compute, "_StageKernels", Counted)
    return counts


def test_a_plan_makes_each_ranks_kernel_table_once(made):
    stand_ins = traces.plan._stand_ins(MODEL, LAYOUT, list(range(LAYOUT.world)))
    assert 2 < len(stand_ins) < LAYOUT.world  # some ranks stand in for others
    build(MODEL, LAYOUT)
    assert made == Counter(range(LAYOUT.world))  # stand-ins too: counted, then built from


def test_a_plan_makes_each_kernels_op_row_once(monkeypatch):
    """The ranks' tables share their op rows (`compute._fields`): one row per distinct
    (kernel, phase) of the plan, the very ones ranks lowered one by one make again and again
    (every EP rank has a table of its own; the plan's ops equal theirs: the next test)."""
    made: list[tuple[object, object]] = []
    row = compute._row
    monkeypatch.setattr(compute, "_row", lambda k, phase: made.append((k, phase)) or
                        row(k, phase))
    build(MODEL, LAYOUT)
    shared, made[:] = list(made), []
    schedule = layout_schedule(LAYOUT)
    for rank in range(LAYOUT.world):
        lower_rank(MODEL, LAYOUT, rank, schedule[LAYOUT.coords(rank).pp])
    assert len(shared) == len(set(shared)) and set(shared) == set(made)
    assert len(shared) < len(made)


def test_a_plan_built_from_the_kept_tables_equals_each_rank_lowered_afresh():
    plan = build(MODEL, LAYOUT)
    schedule = layout_schedule(LAYOUT)
    for rank in range(LAYOUT.world):
        assert plan.ops[rank] == lower_rank(MODEL, LAYOUT, rank,
                                            schedule[LAYOUT.coords(rank).pp]), rank


def test_the_check_keeps_every_stand_ins_table_within_the_cap_and_none_past_it(monkeypatch):
    chosen = list(range(LAYOUT.world))
    stand_ins = traces.plan._stand_ins(MODEL, LAYOUT, chosen)
    size = traces.plan._compute_size(MODEL, LAYOUT, chosen)
    monkeypatch.setattr(traces.plan, "MAX_PLAN_OPS", size)
    within = KernelTables()
    assert traces.plan._compute_size(MODEL, LAYOUT, chosen, within) == size
    assert all(within.take(r) is not None for r in stand_ins)
    monkeypatch.setattr(traces.plan, "MAX_PLAN_OPS", size - 1)
    past = KernelTables()
    assert traces.plan._compute_size(MODEL, LAYOUT, chosen, past) == size  # counted in full
    assert all(past.take(r) is None for r in stand_ins)


def test_a_plan_past_the_cap_is_refused_before_any_rank_is_lowered(monkeypatch):
    from traces.errors import ConfigError

    def refuse(*args, **kwargs):
        raise AssertionError("a rank was lowered")

    size = traces.plan._compute_size(MODEL, LAYOUT, list(range(LAYOUT.world)))
    monkeypatch.setattr(traces.plan, "MAX_PLAN_OPS", size - 1)
    monkeypatch.setattr(traces.plan, "lower_rank", refuse)
    with pytest.raises(ConfigError,
                       match=rf"^plan: at least {size:,} ops for {LAYOUT.world} ranks"):
        build(MODEL, LAYOUT)
