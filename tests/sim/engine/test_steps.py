"""How the replay cuts a rank's streams into steps (`sim.engine.steps`), and that the cut changes
no time: a run of kernels is one step exactly where nobody can observe the instants inside it."""

from array import array

from sim.engine.lowering import CommOp
from sim.engine.replay import replay
from sim.engine.steps import COMM, CONTIGUOUS, KERNEL, PLAIN, RUN, rank_steps
from traces.ops import Op, OpKind, Trace


def kernel(seconds, stream="c", deps=(), **timed):
    return Op(kind=OpKind.COMPUTE, stream=stream, name="k", flops=seconds, deps=deps, **timed)


def flops(op):
    return op.flops


def cut(ops, gaps=None, comm=None, kept=None):
    """The steps per stream; `kept`: the kernels that must be found timed (None: none)."""
    shared: dict = {}
    calls = array("i", bytes(4 * len(ops)))
    streams, found = rank_steps(ops, flops, gaps, comm or {}, calls, lambda op: True, shared)
    assert found == kept
    return streams


def shape(steps):
    """Per step: its kind, first index, and what it covers (a run's length or indices)."""
    return [(s[0], s[1], s[5] if s[0] == RUN else None) for s in steps]


def test_kernels_back_to_back_are_one_run_that_breaks_where_someone_waits_or_a_gap_is():
    ops = (kernel(1.0), kernel(2.0), kernel(3.0),  # 0 is waited for (by 5): it ends a step
           kernel(4.0, stream="d", deps=(2,)),     # 3 waits for 2: 2 ends the run 1-2
           kernel(5.0), kernel(6.0, deps=(0,)),    # 4; 5 has deps: it starts a new step
           kernel(7.0), kernel(8.0))               # 6 has a gap (below): it starts one
    (c, d) = cut(ops, gaps=[0.0] * 6 + [0.5, 0.0])
    assert shape(c) == [(KERNEL, 0, None), (RUN, 1, 2), (KERNEL, 4, None), (KERNEL, 5, None),
                        (RUN, 6, 2)]
    assert shape(d) == [(KERNEL, 3, None)]
    assert c[1][6] == (2.0, 3.0) and c[1][7] == PLAIN | CONTIGUOUS
    assert c[0][5] == 1.0  # a kernel's duration
    assert c[4][4] == 0.5  # the gap the run waits before it starts
    assert c[3][3] == (0,) and d[0][3] == (2,)  # what each step's first op waits for


def test_a_run_across_another_streams_ops_lists_its_indices_and_equal_runs_share_durations():
    ops = (kernel(1.0), kernel(9.0, stream="d"), kernel(2.0),  # c: 0, 2 (not contiguous)
           kernel(1.0, stream="e"), kernel(2.0, stream="e"))   # e: 3, 4
    c, d, e = cut(ops)
    assert shape(c) == [(RUN, 0, (0, 2))] and c[0][7] == PLAIN
    assert shape(e) == [(RUN, 3, 2)]
    assert c[0][6] is e[0][6]  # (1.0, 2.0) once


def test_communication_is_its_own_step_and_a_kept_kernel_makes_a_run_not_plain():
    ar = Op(kind=OpKind.ALL_REDUCE, stream="c", group=(0, 1), size_bytes=1.0)
    comm = {1: CommOp(lowered=0, channel=0, queue=0, need=2)}
    ops = (kernel(1.0), ar, kernel(1.0, start=0.0, end=1.0), kernel(2.0))
    steps, = cut(ops, kept=[False, False, True, False], comm=comm)
    assert [s[0] for s in steps] == [KERNEL, COMM, RUN]
    assert steps[1][5] is comm[1] and steps[2][7] == CONTIGUOUS  # not PLAIN


def test_a_rank_replays_as_its_ops_one_by_one(h100):
    """The times of a cut replay equal the sums taken op by op: each kernel starts where the
    one before it on its stream ended, a waiter where its dependency ended."""
    ops = (kernel(0.1), kernel(0.2), kernel(0.3), kernel(0.25, stream="d", deps=(1,)),
           kernel(0.4), kernel(0.5, deps=(3,)), kernel(0.6))
    times = replay(Trace({0: ops}), h100, type("F", (), {"duration": staticmethod(flops)})())
    ends = [0.1, 0.1 + 0.2, 0.1 + 0.2 + 0.3, 0.1 + 0.2 + 0.25]
    ends += [ends[2] + 0.4, max(ends[2] + 0.4, ends[3]) + 0.5]
    ends.append(ends[5] + 0.6)
    assert times.ends[0] == ends
    assert times.starts[0] == [0, 0.1, 0.1 + 0.2, 0.1 + 0.2, ends[2], ends[4], ends[5]]
