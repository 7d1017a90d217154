"""Run-time matching of communication: who waits for whom.

As NCCL matches calls on a communicator, the k-th collective a rank issues on a group meets the
k-th that every other member issues on it; the k-th send from a to b with a tag meets the k-th
receive on b from a with that tag. "Issues" is program order: k is the call's place among the
rank's calls on the channel in its op list (`CommPlan.calls`, numbered in lowering), not the
order its streams happen to reach them, which a slow rank with two streams on one group (ZeRO-3's
gathers and reductions) may change. `Meetings.arrive` gathers the members of call k; the last to
arrive gets `last=True` and runs the transfer for all, the others wait on the meeting's `done`
event. A stream that reaches call k+1 before another stream of its rank has reached call k does
not wait for it (docs/engine.md, "Meetings").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

from sim.engine.lowering import CommOp, CommPlan
from traces.errors import ConfigError
from traces.ops import Op


@dataclass(eq=False, slots=True)
class Meeting:
    """A collective or a send/recv pair gathering its members."""

    need: int
    first: Op
    """The op of the first member to arrive (the others must agree with it)."""
    done: simpy.Event
    """Fires when the communication has finished."""
    arrived: int = 0
    ranks: list[int] = field(default_factory=list)
    """The members that have arrived, in order."""
    start: float = 0.0
    """When the last member arrived and the communication started."""


class Meetings:
    """The meetings of one replay, open and to come."""

    def __init__(self, env: simpy.Environment, comm: CommPlan) -> None:
        self.env = env
        self.channels = comm.channels
        self._open: dict[tuple[int, int], Meeting] = {}

    def arrive(self, rank: int, op: Op, comm: CommOp, seq: int) -> tuple[Meeting, bool]:
        """`rank` issues `op`, its call number `seq` on the op's channel: the meeting it joins,
        and whether it completes it."""
        key = (comm.channel, seq)
        meeting = self._open.get(key)
        if meeting is None:
            meeting = self._open[key] = Meeting(comm.need, op, self.env.event())
        elif op.kind.is_collective and (meeting.first.kind is not op.kind
                                        or meeting.first.size_bytes != op.size_bytes):
            first = meeting.first
            raise ConfigError(f"trace: rank {rank} issues {op.kind} of {op.size_bytes:g} B as "
                              f"call #{seq} on {list(self.channels[comm.channel].ranks)}, but "
                              f"another member issued {first.kind} of {first.size_bytes:g} B")
        meeting.arrived += 1
        meeting.ranks.append(rank)
        if meeting.arrived < meeting.need:
            return meeting, False
        del self._open[key]
        meeting.start = self.env.now
        return meeting, True
