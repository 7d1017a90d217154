"""The pipeline fill F of the variability model, derived per schedule, equals one slot plus
the excess over M slots of the schedule's own step (`traces.zero_bubble.makespan`) at equal
chunk passes (a full backward twice a forward): the closed form against the action lists."""

import pytest

from sim.models.variability import fill_slots, step_stretch
from topology.variability import Variability
from traces.dualpipe_order import first_stages, last_stages
from traces.layout import Layout
from traces.pipeline import build_schedule
from traces.zero_bubble import makespan

# schedule -> (vp, times of one chunk pass, chunk passes a micro-batch takes on a rank)
SPLIT = {"F": 1.0, "B": 1.0, "W": 1.0}
WHOLE = {"F": 1.0, "B": 2.0}
CASES = {"1f1b": (1, WHOLE, 3), "interleaved": (2, WHOLE, 6), "zbv": (2, SPLIT, 6),
         "zb1p": (2, SPLIT, 6),
         "dualpipev": (2, SPLIT, 6), "dualpipe": (1, SPLIT, 3)}


@pytest.mark.parametrize("schedule", sorted(CASES))
@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("per", [2, 4])
def test_fill_is_one_slot_plus_the_schedules_excess(schedule, pp, per):
    vp, times, slot = CASES[schedule]
    m = per * pp
    actions = build_schedule(schedule, pp, m, vp)
    ends = (first_stages(pp), last_stages(pp)) if schedule == "dualpipe" else None
    step = makespan(actions, times, ends) if ends else makespan(actions, times)
    layout = Layout(pp=pp, vp=vp, global_batch=m, schedule=schedule)
    assert fill_slots(layout) == pytest.approx(1 + (step - m * slot) / slot, rel=1e-12)


@pytest.mark.parametrize("vp", [1, 3, 4])
@pytest.mark.parametrize("pp", [2, 3, 8])
def test_zb1p_fill_follows_its_action_list_at_every_vp(vp, pp):
    """ZB-1P (torch's ScheduleInterleavedZeroBubble order) at 1 to 4 chunks a rank: a slot is
    3·vp chunk passes and the step's excess pp - 1 of them, F = 1 + (pp - 1) / (3 vp), not
    the interleaved form's 1 + (pp - 1) / vp."""
    m = 2 * pp
    step = makespan(build_schedule("zb1p", pp, m, vp), SPLIT)
    layout = Layout(pp=pp, vp=vp, global_batch=m, schedule="zb1p")
    assert fill_slots(layout) == pytest.approx(1 + (step - 3 * vp * m) / (3 * vp), rel=1e-12)


def test_dualpipe_stretch_weights_its_own_fill():
    """e = (F e_member + (M - 1) e_world) / (F + M - 1) with DualPipe's F = 1 + (pp/2 - 1)/3,
    not 1F1B's pp: the two ends of the mean are the stretches at M = 1 and M -> large."""
    v = Variability(jitter=0.05)
    member = step_stretch(v, Layout(tp=2, pp=8, dp=2, global_batch=2), 8)  # M = 1: e_member
    two = step_stretch(v, Layout(tp=2, pp=8, dp=2, global_batch=4), 8)  # (8 e_m + e_w) / 9
    world = 9 * two - 8 * member
    assert world > member  # the slowest of 32 ranks against the slowest of a TP pair
    m = 32
    dual = Layout(tp=2, pp=8, dp=2, global_batch=2 * m, schedule="dualpipe")
    fill = 1 + (8 / 2 - 1) / 3
    assert step_stretch(v, dual, 8) == pytest.approx(
        (fill * member + (m - 1) * world) / (fill + m - 1), rel=1e-9)
