"""Zero-bubble ZB-1P (`traces.zero_bubble`): PyTorch's own order, its closed-form bubble, the
layout's rules and the activations a deferred W keeps."""

from __future__ import annotations

import pytest

from traces.errors import ConfigError
from traces.layout import Layout
from traces.pipeline import Action, build_schedule, one_f_one_b, validate
from traces.zero_bubble import frees_at, makespan, zb1p

CASES = [(pp, vp, m) for pp in (2, 3, 4) for vp in (1, 2) for m in (1, 2, 3, 4, 6, 8, 12)
         if m % max(1, m // pp) == 0]


def torch_order(pp: int, m: int, vp: int) -> dict[int, list[str]]:
    """ScheduleInterleavedZeroBubble's pipeline_order, built without stages or a process
    group (its two order-making methods read only the fields set here); I printed as B."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = schedules.ScheduleInterleavedZeroBubble
    obj = object.__new__(cls)
    obj.pp_group_size, obj._n_microbatches, obj.n_local_stages = pp, m, vp
    obj.number_of_rounds = max(1, m // pp)
    obj.microbatches_per_round = m // obj.number_of_rounds
    obj.pipeline_order = {r: obj._calculate_single_rank_operations(r) for r in range(pp)}
    obj.pipeline_order = obj._add_bubbles_to_actions(vp * pp)
    return {r: [str(a).replace("I", "B") for a in acts if a is not None]
            for r, acts in obj.pipeline_order.items()}


@pytest.mark.parametrize(("pp", "vp", "m"), CASES)
def test_zb1p_is_torch_order(pp, vp, m):
    mine = build_schedule("zb1p", pp, m, vp)  # validated: every F, B, W once, no deadlock
    assert {r: [str(a) for a in acts] for r, acts in mine.items()} == torch_order(pp, m, vp)


def test_zb1p_small_case_by_hand():
    # pp 3, m 6: rank r warms up with 2 - r forwards, weighs from its (r + 1)-th B on.
    assert " ".join(map(str, zb1p(3, 6)[1])) == (
        "1F0 1F1 1B0 1F2 1B1 1W0 1F3 1B2 1W1 1F4 1B3 1W2 1F5 1B4 1W3 1B5 1W4 1W5")


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("per", [1, 2, 4])
@pytest.mark.parametrize("times", [(1.0, 1.0, 1.0), (1.0, 1.5, 0.7), (1.0, 1.25, 1.0)])
def test_zb1p_bubble_is_zb_h1_closed_form(pp, per, times):
    """ZB-H1's bubble (Qi et al., §3): (p - 1)(T_F + T_B - T_W) when T_W <= T_F + T_B, against
    1F1B's (p - 1)(T_F + T_B + T_W); the step is m(T_F + T_B + T_W) plus the bubble."""
    f, b, w = times
    m = per * pp
    step = makespan(zb1p(pp, m), {"F": f, "B": b, "W": w})
    assert step == pytest.approx(m * (f + b + w) + (pp - 1) * (f + b - w))
    flush = makespan(one_f_one_b(pp, m), {"F": f, "B": b + w, "W": 0.0})
    assert flush == pytest.approx(m * (f + b + w) + (pp - 1) * (f + b + w))
    assert step / (m * (f + b + w)) - 1 == pytest.approx((pp - 1) * (f + b - w) / (m * (f + b + w)))


def in_flight_until(actions, kind):
    """Peak count of (stage, micro-batch) forwarded and not yet past their `kind`."""
    held, peak = set(), 0
    for a in actions:
        if a.kind == "F":
            held.add((a.stage, a.microbatch))
        elif a.kind == kind:
            held.discard((a.stage, a.microbatch))
        peak = max(peak, len(held))
    return peak


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_zb1p_peak_in_flight_is_pp_like_1f1b(pp):
    """Stored activations live until W (`frees_at`): every rank holds pp micro-batches at its
    peak (its pp - 1 - r warm-up forwards, one more, and the r B's whose W it defers), 1F1B's
    first rank's pp: ZB-1P's peak memory is 1F1B's (Qi et al.: the "1P")."""
    m = 3 * pp
    schedule = zb1p(pp, m)
    for r in range(pp):
        assert frees_at(schedule[r]) == "W"
        assert in_flight_until(schedule[r], "W") == pp
        assert in_flight_until(schedule[r], "B") == pp - r  # B alone would free 1F1B's way
        assert in_flight_until(one_f_one_b(pp, m)[r], "B") == pp - r


def test_validator_needs_w_after_its_b():
    schedule = zb1p(2, 2)
    actions = schedule[1]
    w = actions.index(Action(1, "W", 0))
    b = actions.index(Action(1, "B", 0))
    actions[w], actions[b] = actions[b], actions[w]
    with pytest.raises(ConfigError, match="deadlock"):
        validate(schedule, 2, 2)
    schedule = zb1p(2, 2)
    schedule[0].remove(Action(0, "W", 1))
    with pytest.raises(ConfigError, match="missing e.g. \\['0W1'\\]"):
        validate(schedule, 2, 2)


def test_parse_w():
    assert Action.parse("3W2") == Action(3, "W", 2)


@pytest.mark.parametrize(("keys", "message"), [
    ({"pp": 2, "global_batch": 7}, "7 micro-batches are not a multiple of max(1, m // pp) = 3"),
    ({"pp": 4, "global_batch": 9}, "9 micro-batches are not a multiple of max(1, m // pp) = 2"),
    ({"pp": 2, "dp": 2, "zero": 3, "global_batch": 8}, "parallel.zero: 3"),
    ({"pp": 2, "tp": 2, "sp": True, "tp_comm_overlap": True, "global_batch": 4},
     "parallel.tp_comm_overlap"),
])
def test_bad_layouts_are_refused(keys, message):
    with pytest.raises(ConfigError, match=message.replace("(", "\\(").replace(")", "\\)")):
        Layout(schedule="zb1p", **keys)


def test_vp_is_allowed_with_zb1p():
    assert Layout(pp=2, vp=2, schedule="zb1p", global_batch=4).vp == 2
