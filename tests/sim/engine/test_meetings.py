"""Run-time matching: the k-th call on a channel meets the k-th call of every other member."""

import pytest
import simpy

from sim.engine.lowering import lower_communication
from sim.engine.meetings import Meetings
from traces.errors import ConfigError
from traces.ops import Op, OpKind, Trace

MiB = 2**20


def ar(size=MiB, kind=OpKind.ALL_REDUCE):
    return Op(kind=kind, stream="c", group=(0, 1), size_bytes=size)


def test_the_kth_collective_of_each_member_meet_and_the_last_to_arrive_runs_it(h100):
    plan = Trace({0: (ar(), ar(2 * MiB)), 1: (ar(), ar(2 * MiB))})
    comm = lower_communication(plan, h100, None)
    env = simpy.Environment()
    meetings = Meetings(env, comm)
    first, last = meetings.arrive(0, plan.ops[0][0], comm.ops[0][0], comm.calls[0][0])
    # rank 0 runs ahead
    second, _ = meetings.arrive(0, plan.ops[0][1], comm.ops[0][1], comm.calls[0][1])
    assert not last and second is not first
    env.run(until=1.5)
    joined, last = meetings.arrive(1, plan.ops[1][0], comm.ops[1][0], comm.calls[1][0])
    assert joined is first and last and first.start == 1.5
    joined, last = meetings.arrive(1, plan.ops[1][1], comm.ops[1][1], comm.calls[1][1])
    assert joined is second and last


def test_receives_match_sends_by_tag_not_by_arrival(h100):
    def send(tag):
        return Op(kind=OpKind.SEND, stream="s", peer=1, size_bytes=MiB, tag=tag)

    def recv(tag):
        return Op(kind=OpKind.RECV, stream="r", peer=0, size_bytes=MiB, tag=tag)

    plan = Trace({0: (send("a"), send("b")), 1: (recv("b"), recv("a"))})
    comm = lower_communication(plan, h100, None)
    meetings = Meetings(simpy.Environment(), comm)
    sent = [meetings.arrive(0, op, comm.ops[0][i], comm.calls[0][i])[0]
            for i, op in enumerate(plan.ops[0])]
    got = [meetings.arrive(1, op, comm.ops[1][i], comm.calls[1][i])
           for i, op in enumerate(plan.ops[1])]
    assert got == [(sent[1], True), (sent[0], True)]


def test_members_that_disagree_on_a_call_are_reported(h100):
    plan = Trace({0: (ar(),), 1: (ar(kind=OpKind.ALL_GATHER),)})
    comm = lower_communication(plan, h100, None)
    meetings = Meetings(simpy.Environment(), comm)
    meetings.arrive(0, plan.ops[0][0], comm.ops[0][0], comm.calls[0][0])
    with pytest.raises(ConfigError, match=r"rank 1 issues all_gather of 1.04858e\+06 B as call "
                                          r"#0 on \[0, 1\], but another member issued all_reduce"):
        meetings.arrive(1, plan.ops[1][0], comm.ops[1][0], comm.calls[1][0])
