"""overlap_moe_comm's rules, pairs and plan (issue 33, item 2): Megatron-Core's refusals in one
line; the pairs are a forward and a backward of different micro-batches, none in warm-up or
cool-down; the plan holds the same ops as without, the all-to-alls on `ep_comm`, each pair's
pieces in Megatron-Core's per-layer order."""

from __future__ import annotations

import pytest

from traces.errors import ConfigError
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.moe_overlap import DISPATCHER_SMS, check_pairs, comm_sms, pairs, steps
from traces.ops import Stream
from traces.pipeline import Action, interleaved, layout_schedule, one_f_one_b, validate
from traces.plan import build
from traces.purpose import ExpertAllToAll, MoeStep

MOE = dict(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, experts=4, top_k=2,
           moe_ffn_hidden=32, dense_layers=1)


@pytest.mark.parametrize(("model", "layout", "rule"), [
    (dict(MOE, experts=0, top_k=0, moe_ffn_hidden=0, dense_layers=0), dict(dp=2),
     "needs an MoE model"),
    (MOE, dict(dp=2), "needs ep > 1"),
    (MOE, dict(pp=2, dp=2, ep=2, global_batch=4), "needs schedule = \"interleaved\""),
    (MOE, dict(dp=2, ep=2, schedule="gpipe", global_batch=4), "needs schedule = \"1f1b\""),
    (MOE, dict(dp=2, ep=2, recompute="full"), "recompute = \"full\""),
])
def test_megatron_cores_refusals(model: dict, layout: dict, rule: str) -> None:
    with pytest.raises(ConfigError, match="parallel.overlap_moe_comm") as err:
        check_layout(ModelSpec(**model),
                     Layout(**{"global_batch": 4, **layout, "overlap_moe_comm": True}))
    assert rule in str(err.value) and "\n" not in str(err.value)


def test_a_non_boolean_is_refused() -> None:
    with pytest.raises(ConfigError, match="parallel.overlap_moe_comm"):
        Layout(overlap_moe_comm="yes")  # type: ignore[arg-type]


def test_no_pipeline_pairs_each_backward_with_the_next_forward() -> None:
    """Megatron-Core's combined_1f1b_schedule_for_no_pipelining: F0, (F1 B0), ..., B(m-1):
    1F1B with one warm-up forward, the layout's schedule with the key."""
    actions = layout_schedule(Layout(dp=2, ep=2, global_batch=8, overlap_moe_comm=True))[0]
    assert actions == one_f_one_b(1, 4, extra=1)[0]
    assert [tuple(map(str, s)) for s in steps(actions)] == [
        ("0F0",), ("0F1", "0B0"), ("0F2", "0B1"), ("0F3", "0B2"), ("0B3",)]
    assert pairs(one_f_one_b(1, 4)[0]) == [(1, 2), (3, 4), (5, 6)]  # (B0 F1): as pairable


@pytest.mark.parametrize(("pp", "vp", "m"), [(2, 2, 4), (4, 2, 8), (2, 4, 6), (4, 3, 16)])
def test_interleaved_pairs_are_the_steady_state_with_one_more_warm_up(pp, vp, m) -> None:
    """One warm-up forward more (Megatron-Core under overlap): rank r warms up with
    w = 2(pp - r - 1) + (vp - 1)·pp + 1 forwards, then its m·vp - w steady forwards each pair
    with the backward after them; the pairs run without deadlock."""
    schedule = interleaved(pp, vp, m, extra=1)
    validate(schedule, pp, m, vp)
    check_pairs(schedule, pp * vp)
    for r, actions in schedule.items():
        w = min(2 * (pp - r - 1) + (vp - 1) * pp + 1, m * vp)
        assert pairs(actions) == [(w + 2 * i, w + 2 * i + 1) for i in range(m * vp - w)]
        assert all(actions[i].kind == "F" and actions[j].kind == "B" and
                   actions[i].microbatch != actions[j].microbatch for i, j in pairs(actions))


def test_all_warm_up_pairs_nothing_and_a_deadlock_is_refused() -> None:
    assert all(not pairs(a) for a in interleaved(2, 2, 2, extra=1).values())
    with pytest.raises(ConfigError, match="deadlock"):  # plain 1F1B's last rank pairs B0 F1
        check_pairs(one_f_one_b(2, 4), 2)
    assert pairs([Action(0, "F", 0), Action(0, "B", 0)]) == []


def _plan(on: bool, **layout):
    model = ModelSpec(**MOE)
    return build(model, Layout(**{"dp": 2, "ep": 2, "global_batch": 8, **layout,
                                  "overlap_moe_comm": on}))


def _key(op):
    """An op's fields but its stream, which only an all-to-all changes."""
    moved = isinstance(op.purpose, ExpertAllToAll)
    return (op.name, op.kind, op.layer, op.microbatch, op.phase, op.size_bytes,
            "" if moved else op.stream)


@pytest.mark.parametrize("layout", [{}, dict(pp=2, vp=2, schedule="interleaved")])
def test_the_plan_holds_the_same_ops_its_all_to_alls_on_their_stream(layout: dict) -> None:
    off, on = _plan(False, **layout), _plan(True, **layout)
    for rank in off.ops:
        assert sorted(map(_key, off.ops[rank])) == sorted(map(_key, on.ops[rank]))
        a2a = [op.stream for op in on.ops[rank] if isinstance(op.purpose, ExpertAllToAll)]
        assert a2a and set(a2a) == {Stream.EP_COMM}


def test_a_pairs_all_to_alls_alternate_as_megatron_core_orders_them() -> None:
    """No pipeline, one MoE layer per pass (layers 1-3 are MoE: three): in the pair (B0, F1)
    the ep_comm stream holds B0's combine grad, F1's dispatch, B0's dispatch grad, F1's
    combine, layer by layer (the backward's layers from the last)."""
    plan = _plan(True)
    a2a = [op for op in plan.ops[0] if isinstance(op.purpose, ExpertAllToAll)]
    pair = [(op.microbatch, op.layer, op.purpose.step, op.purpose.grad) for op in a2a
            if (op.microbatch, op.purpose.grad) in ((0, True), (1, False))]
    D, C = MoeStep.DISPATCH, MoeStep.COMBINE
    want = []
    for f, b in zip((1, 2, 3), (3, 2, 1), strict=True):
        want += [(0, b, C, True), (1, f, D, False), (0, b, D, True), (1, f, C, False)]
    assert pair == want


def test_a_kernel_dispatchers_sms_are_held_beside_overlapped_compute() -> None:
    """Under Megatron-Core's overlap (1f1b) the all-to-all holds its dispatcher's default grid:
    DeepEP's 20 SMs, HybridEP's 16, NCCL none; a stated comm_sms wins; without overlap_moe_comm
    nothing is held beside compute (no op is)."""
    overlap = Layout(dp=2, ep=2, global_batch=4, overlap_moe_comm=True)
    assert DISPATCHER_SMS == {"deepep": 20, "hybridep": 16}
    assert [comm_sms(overlap, d) for d in ("nccl", "deepep", "hybridep")] == [0, 20, 16]
    assert comm_sms(Layout(dp=2, ep=2, global_batch=4, overlap_moe_comm=True, comm_sms=32),
                    "hybridep") == 32
    assert comm_sms(Layout(dp=2, ep=2, global_batch=4), "hybridep") == 0
