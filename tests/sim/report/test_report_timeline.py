"""`sim.report.timeline`: passes, idle gaps, lanes and busy time read off a simulated step.

    pytest tests/sim/report/test_report_timeline.py -q

Interval arithmetic against brute force on random intervals; passes against the schedule
generators for GPipe, 1F1B and interleaved 1F1B; idle time against `sim.metrics`.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.metrics import rank_times
from sim.report.timeline import (
    busy_between,
    idle_intervals,
    lane_usage,
    lanes,
    overlap,
    pipeline_passes,
    rank_ops,
    union,
)
from sim.simulate import predict
from tests.sim.report.report_cases import PP4_M8, TP2_PP2_DP2, experiment, lane_name
from traces.pipeline import build_schedule

intervals = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 60)), max_size=30)


def covered(pieces: list[tuple[int, int]]) -> set[int]:
    """Brute force: the unit cells [t, t+1) inside some interval."""
    return {t for s, e in pieces for t in range(s, e)}


@given(intervals)
def test_union_covers_exactly_the_cells_covered(raw):
    pieces = [(s, s + d) for s, d in raw]
    s, e = union(np.array([p[0] for p in pieces], dtype=float),
                 np.array([p[1] for p in pieces], dtype=float))
    assert np.all(s[1:] > e[:-1])  # disjoint and not touching: merged
    assert covered(list(zip(s.astype(int), e.astype(int)))) == covered(pieces)


@settings(max_examples=50)
@given(intervals, st.lists(st.tuples(st.integers(-50, 1100), st.integers(0, 300)),
                           min_size=1, max_size=10))
def test_busy_between_is_the_covered_length(raw, windows):
    s, e = union(np.array([a for a, _ in raw], dtype=float),
                 np.array([a + d for a, d in raw], dtype=float))
    cells = covered(list(zip(s.astype(int), e.astype(int))))
    lo = np.array([w for w, _ in windows], dtype=float)
    hi = lo + np.array([d for _, d in windows], dtype=float)
    got = busy_between(s, e, lo, hi)
    expected = [sum(1 for t in cells if a <= t < b) for a, b in zip(lo, hi)]
    assert np.allclose(got, expected)


@pytest.mark.parametrize(("schedule", "extra"), [
    ("1f1b", {}), ("gpipe", {}), ("interleaved", {"vp": 2})])
def test_passes_run_in_the_schedule_order(schedule, extra):
    exp = experiment(PP4_M8, schedule=schedule, **extra)
    _, times = predict(exp)
    layout = times.plan.meta.layout
    plan = build_schedule(schedule, 4, 8, extra.get("vp", 1))
    for rank in times.plan.ranks:
        pp = layout.coords(rank).pp
        passes = pipeline_passes(times, rank)
        assert [p.action for p in passes[:-1]] == plan[pp]
        assert passes[-1].kind == "O" and passes[-1].action is None
        assert all(a.end <= b.start for a, b in zip(passes, passes[1:]))
        # every op of the compute stream is in exactly one pass
        on_compute = sum(1 for op in times.plan.ops[rank] if op.stream == "compute")
        assert sum(p.num_ops for p in passes) == on_compute


def test_pass_times_split_into_kernels_collectives_and_recompute():
    exp = experiment(TP2_PP2_DP2)
    _, times = predict(exp)
    for rank in times.plan.ranks:
        idle = idle_intervals(rank_ops(times, rank), times.step_time_s)
        for p in pipeline_passes(times, rank):
            # the optimizer's pass also waits: its gradient norm is all-reduced with the other
            # pipeline stages (traces.plan.optimizer); nothing else waits inside a pass
            waited = overlap(idle, (np.array([p.start]), np.array([p.end])))
            assert waited == 0.0 or p.kind == "O"
            assert p.compute_s + p.tp_s + waited == pytest.approx(p.end - p.start, rel=1e-9)
            assert (p.recompute_s > 0) == (p.kind == "B")  # full recomputation


def test_idle_time_is_the_metric():
    exp = experiment(TP2_PP2_DP2)
    summary, times = predict(exp, fold=False)
    for r in rank_times(times, exp.layout):
        s, e = idle_intervals(rank_ops(times, r.rank), times.step_time_s)
        assert float(np.sum(e - s)) == pytest.approx(r.idle_s, abs=1e-12)


def test_lanes_hold_every_op_once_and_never_overlap():
    exp = experiment(TP2_PP2_DP2)
    _, times = predict(exp)
    for rank in times.plan.ranks:
        ops = times.plan.ops[rank]
        found = lanes(rank_ops(times, rank))
        assert [lane.name for lane in found] == ["compute", "compute/tp",
                                                 *(["send_next", "recv_next"] if rank == 0
                                                   else ["recv_prev", "send_prev"]), "dp"]
        for lane in found:
            mine = [i for i, op in enumerate(ops) if lane_name(op) == lane.name]
            assert lane.num_ops == len(mine)
            assert np.all(lane.starts_ns[1:] >= lane.ends_ns[:-1])
            busy_ns = sum(round(times.ends[rank][i] * 1e9) - round(times.starts[rank][i] * 1e9)
                          for i in mine)
            assert int(np.sum(lane.ends_ns - lane.starts_ns)) == busy_ns
        usage = {u.name: u for u in lane_usage(found)}
        assert usage["compute"].exposed_s == 0
        assert usage["compute/tp"].overlapped_s == 0  # the same stream: never together
        assert 0 <= usage["dp"].overlapped_s <= usage["dp"].busy_s
