"""executor.consistency.problems on small hand-built traces: a sound one passes, and each
broken rule is caught, named in one line."""

from __future__ import annotations

import dataclasses

import pytest

from executor.consistency import problems
from traces.ops import Op, OpKind, Phase, Stream, Trace

GROUP = (0, 1)


def _plan() -> Trace:
    """Per rank: fwd, bwd (after fwd), a gradient all-reduce on the comm stream (after bwd),
    then the optimizer (after the all-reduce)."""
    ops = (Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name="mlp", phase=Phase.FWD, layer=0),
           Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name="mlp", phase=Phase.BWD, layer=0,
              deps=(0,)),
           Op(kind=OpKind.ALL_REDUCE, stream=Stream.DP, group=GROUP, size_bytes=1024,
              deps=(1,)),
           Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name="optimizer", phase=Phase.OPT,
              deps=(2,)))
    return Trace({0: ops, 1: ops})


# (start, end) per op: rank 1 starts its all-reduce a little later, both overlap.
TIMES = {0: [(0.0, 1.0), (1.0, 3.0), (3.0, 4.5), (4.5, 5.0)],
         1: [(0.0, 1.2), (1.2, 3.2), (3.2, 4.5), (4.5, 5.1)]}


def _timed(times: dict[int, list[tuple[float, float]]] | None = None,
           plan: Trace | None = None) -> Trace:
    plan = plan or _plan()
    times = times or TIMES
    return Trace({r: tuple(dataclasses.replace(op, start=s, end=e)
                           for op, (s, e) in zip(ops, times[r]))
                  for r, ops in plan.ops.items()})


def _with(rank: int, index: int, start: float, end: float) -> dict[int, list]:
    times = {r: list(t) for r, t in TIMES.items()}
    times[rank][index] = (start, end)
    return times


def test_a_sound_trace_has_no_problems() -> None:
    assert problems(_timed(), plan=_plan()) == []


def test_an_op_missing_is_named() -> None:
    trace = _timed()
    ops = trace.ops[1]
    cut = Trace({0: trace.ops[0], 1: ops[:2] + ops[3:]})
    found = problems(cut, plan=_plan())
    assert found[0] == "rank 1 plan op 2 (all_reduce 1.0KiB): missing"
    assert "rank 1 op 2 (all_reduce 1.0KiB): not measured" not in found  # it is gone


def test_an_op_twice_is_named() -> None:
    trace = _timed()
    ops = trace.ops[0]
    doubled = Trace({0: ops[:2] + ops[1:], 1: trace.ops[1]})
    found = problems(doubled, plan=_plan())
    assert "rank 0 plan op 1 (mlp bwd L0): there 2 times" in found


def test_an_op_not_in_the_plan_and_ops_out_of_order_are_named() -> None:
    trace = _timed()
    stranger = dataclasses.replace(trace.ops[1][0], name="attn")
    found = problems(Trace({0: trace.ops[0], 1: (stranger, *trace.ops[1][1:])}), plan=_plan())
    assert "rank 1 op 0 (attn fwd L0): not in the plan" in found
    assert "rank 1 plan op 0 (mlp fwd L0): missing" in found
    ops = trace.ops[0]
    swapped = Trace({0: (ops[1], ops[0], *ops[2:]), 1: trace.ops[1]})
    assert "rank 0: the plan's ops, out of plan order" in problems(swapped, plan=_plan())


def test_a_rank_missing_is_named() -> None:
    trace = _timed()
    assert problems(Trace({0: trace.ops[0]}), plan=_plan()) == [
        "rank 1: in the plan, not in the trace"]


def test_an_op_not_measured_is_named() -> None:
    trace = _timed()
    ops = list(trace.ops[0])
    ops[3] = dataclasses.replace(ops[3], end=None)
    assert problems(Trace({0: tuple(ops), 1: trace.ops[1]})) == [
        "rank 0 op 3 (optimizer opt): not measured"]


def test_an_op_ending_before_it_starts_is_named() -> None:
    # ends at 0.5 after starting at 1.0: the bwd that follows at 1.0 still respects it
    assert problems(_timed(_with(0, 0, 1.0, 0.5))) == ["rank 0 op 0 (mlp fwd L0): ends before "
                                                       "it starts"]


def test_two_ops_overlapping_on_one_stream_are_named() -> None:
    # the optimizer (compute stream, no dependency on bwd) starts before bwd ends: make it
    # depend on the all-reduce only and start it inside bwd
    plan = _plan()
    ops = list(plan.ops[0])
    ops[3] = dataclasses.replace(ops[3], deps=())
    plan = Trace({0: tuple(ops), 1: plan.ops[1]})
    found = problems(_timed(_with(0, 3, 2.0, 2.5), plan))
    assert found == ["rank 0 op 3 (optimizer opt): starts before op 1 on stream compute ends"]


def test_a_dependency_ending_after_its_dependant_starts_is_named() -> None:
    # the all-reduce (comm stream) starts at 2.5, before bwd (its dependency) ends at 3.0
    found = problems(_timed(_with(0, 2, 2.5, 4.5)))
    assert found == ["rank 0 op 2 (all_reduce 1.0KiB): starts before its dependency op 1 ends"]


def test_collective_members_apart_in_time_are_named() -> None:
    times = {r: list(t) for r, t in TIMES.items()}
    times[1][2:] = [(4.6, 4.8), (4.8, 5.1)]  # rank 0's all-reduce ended at 4.5
    found = problems(_timed(times))
    assert found == [f"collective 0 on stream {Stream.DP} group [0, 1]: members [0, 1] do not "
                     "overlap in time"]
    assert problems(_timed(times), tolerance_s=0.2) == []  # within the clock error bound


def test_ops_of_one_span_share_their_interval() -> None:
    # fwd and bwd as one measured call (span 7), both (0, 3): not an overlap, not a broken
    # dependency; without the span id they are both
    times = {r: [(0.0, 3.0), (0.0, 3.0), *t[2:]] for r, t in TIMES.items()}
    trace = _timed(times)
    assert len(problems(trace)) == 4
    spanned = Trace({r: tuple(dataclasses.replace(op, span=7) if i < 2 else op
                              for i, op in enumerate(ops)) for r, ops in trace.ops.items()})
    assert problems(spanned, plan=_plan()) == []


@pytest.mark.parametrize("limit", [1, 3])
def test_the_list_is_cut_at_the_limit(limit: int) -> None:
    times = {r: [(1.0, 0.0)] * 4 for r in TIMES}
    assert len(problems(_timed(times), limit=limit)) == limit
