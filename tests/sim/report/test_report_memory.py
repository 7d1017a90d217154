"""`sim.models.memory.memory_timeline`: memory over the step from the same accounting as the peak.

    pytest tests/sim/report/test_report_memory.py -q

The curve's top must be `pp_rank_memory(...).total_bytes` (the number the memory table and the
fits verdict use), the activations must rise through the warm-up by one micro-batch's worth per
forward and fall back to the model states at the end, whatever the schedule.
"""

import pytest

from sim.models.memory import (
    activation_bytes_per_layer,
    memory_timeline,
    pp_rank_memory,
    working_bytes,
)
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.pipeline import Action, build_schedule

MODEL = ModelSpec(layers=16, hidden=1024, heads=16, seq_len=512, vocab=32000)


def unit_times(actions: list[Action]) -> list[tuple[Action, float, float]]:
    """Each action one second long, back to back."""
    return [(a, float(i), float(i + 1)) for i, a in enumerate(actions)]


@pytest.mark.parametrize(("schedule", "pp", "vp", "m", "recompute", "zero"), [
    ("1f1b", 4, 1, 8, "none", 0),
    ("1f1b", 4, 1, 2, "full", 1),
    ("gpipe", 4, 1, 8, "selective", 0),
    ("interleaved", 4, 2, 8, "full", 3),
    ("1f1b", 1, 1, 4, "none", 3),
])
def test_the_top_of_the_curve_is_the_stage_peak(schedule, pp, vp, m, recompute, zero):
    layout = Layout(tp=2, pp=pp, dp=2, vp=vp, schedule=schedule, recompute=recompute,
                    zero=zero, global_batch=2 * m)
    plan = build_schedule(schedule, pp, m, vp)
    for r in range(pp):
        points = memory_timeline(MODEL, layout, r, unit_times(plan[r]))
        peak = pp_rank_memory(MODEL, layout, r, plan[r])
        assert max(b for _, b in points) == pytest.approx(peak.total_bytes, rel=1e-12)
        states = peak.params_bytes + peak.grads_bytes + peak.optimizer_bytes
        assert points[0] == (0.0, states) and points[-1][1] == pytest.approx(states)
        assert [t for t, _ in points] == sorted(t for t, _ in points)


def test_1f1b_holds_pp_minus_rank_micro_batches_at_most():
    # 1F1B: rank r runs pp - r - 1 warm-up forwards, then one more before its first backward,
    # so it holds min(pp - r, m) micro-batches; the curve's steps are one micro-batch each.
    layout = Layout(pp=4, global_batch=8)
    per_mb = (MODEL.layers // 4) * activation_bytes_per_layer(MODEL, layout)
    plan = build_schedule("1f1b", 4, 8)
    for r in range(4):
        points = memory_timeline(MODEL, layout, r, unit_times(plan[r]))
        states = points[0][1]
        work = working_bytes(MODEL, layout, r)
        held = [(b - states) / per_mb for _, b in points[2::2]]  # after each pass
        assert max(held) == pytest.approx(min(4 - r, 8))
        assert all(abs(h - round(h)) < 1e-9 for h in held)
        during = [(b - states - work) / per_mb for _, b in points[1::2]]
        assert max(during) == pytest.approx(min(4 - r, 8))


def test_times_are_the_passes_own():
    layout = Layout(pp=2, global_batch=2)
    plan = build_schedule("1f1b", 2, 2)[0]  # 0F0 0F1 0B0 0B1
    timed = [(a, 10.0 * i + 1, 10.0 * i + 4) for i, a in enumerate(plan)]
    points = memory_timeline(MODEL, layout, 0, timed)
    assert [t for t, _ in points] == [0.0, 1, 4, 11, 14, 21, 24, 31, 34]


def test_a_backward_before_its_forward_is_refused():
    layout = Layout(pp=2, global_batch=2)
    with pytest.raises(ConfigError, match="0B0 runs before the forward 0F0"):
        memory_timeline(MODEL, layout, 0, [(Action(0, "B", 0), 0.0, 1.0)])
