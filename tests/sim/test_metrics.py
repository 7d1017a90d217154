"""Where the time goes: compute, exposed communication and idle time on hand-made timelines."""

import numpy as np
import pytest

from sim.engine.replay import StepTimes
from sim.metrics import _union_length, rank_times
from traces.ops import Op, OpKind, Trace


def test_union_length_merges_overlaps_and_skips_gaps():
    starts, ends = np.array([0.0, 0.5, 3.0, 3.2]), np.array([1.0, 2.0, 4.0, 3.5])
    assert _union_length(starts, ends) == 2.0 + 1.0
    assert _union_length(np.array([]), np.array([])) == 0.0


def test_exposed_communication_is_what_compute_does_not_hide():
    c = Op(kind=OpKind.COMPUTE, stream="compute")
    ar = Op(kind=OpKind.ALL_REDUCE, stream="dp", group=(0,))
    plan = Trace({0: (c, c, ar, ar), 1: (c,)})
    # rank 0: compute [0,1] and [2,3]; communication [0.5,2.5] and [5,6]; the step ends at 8.
    times = StepTimes(plan, {0: [0.0, 2.0, 0.5, 5.0], 1: [0.0]}, {0: [1.0, 3.0, 2.5, 6.0],
                                                                  1: [8.0]}, {})
    r0, r1 = rank_times(times)
    assert (r0.compute_s, r0.exposed_comm_s, r0.idle_s) == (2.0, 2.0, 4.0)
    assert (r1.compute_s, r1.exposed_comm_s, r1.idle_s) == (8.0, 0.0, 0.0)
    assert r0.compute_s + r0.exposed_comm_s + r0.idle_s == pytest.approx(times.step_time_s)
