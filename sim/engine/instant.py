"""Kernels that start at the same instant as a transfer of their rank: re-timed, so that the
interference model's stretch does not depend on the order in which the engine resumes the
streams within one timestamp (issue 33).

The rule (`sim.models.interference`): a kernel is beside every transfer of its rank in flight
over [start, end) of the transfer, so a kernel that starts at the instant a transfer starts
is beside it, and one that starts at the instant a transfer ends is not. The replay decides
a kernel's duration when it starts (`sim.engine.occupancy`); a stream resumed before the
transfer's own stream at that instant saw the rank idle (a Megatron-Core overlapped pair's
compute and its expert all-to-all, issued together, ran at full speed). So each kernel (or
run of kernels, `sim.engine.steps`) that starts is noted here, and when its rank starts or
stops moving data at the same instant, it is timed again as if it had started after that:
a new timeout of the new seconds takes over the old one's callbacks (the old one then fires
for nobody), and a run's times are rewritten in place (the replay reads them when it ends).
The new seconds are the same float products and sums the replay takes, so the two orders
give the same bits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import simpy

from sim.engine.steps import CONTIGUOUS, KERNEL, Step
from traces.ops import Op


class Rates(Protocol):
    """What re-timing reads of `sim.engine.occupancy.Occupancy`: the rank's state now."""

    busy: dict[int, int]
    scale: dict[int, float]
    base: dict[int, float]
    per_kernel: bool

    def kernel_scale(self, op: Op) -> float: ...


class SameInstant:
    """The kernels each rank started at the latest instant it started one, and their times."""

    def __init__(self, env: simpy.Environment, rates: Rates, ranks: Iterable[int],
                 ops: Mapping[int, Sequence[Op]], kept: Mapping[int, list[bool]]) -> None:
        self.env, self.rates, self.ops, self.kept = env, rates, ops, kept
        self.at = dict.fromkeys(ranks, -1.0)
        """Per rank, the instant its `started` kernels started."""
        self.started: dict[int, list[list[Any]]] = {r: [] for r in self.at}
        """Per rank, [event, step, times] of each kernel step started at `at[rank]`: the
        timeout it waits on, its step, and for a run the list of its ops' times."""

    def note(self, rank: int, event: simpy.Event, step: Step, times: list[float] | None) -> None:
        """Kernel step `step` of `rank` starts now and waits on `event` (a run: `times`)."""
        now = self.env._now  # type: ignore[attr-defined]
        if self.at[rank] == now:
            self.started[rank].append([event, step, times])
        else:
            self.at[rank] = now
            self.started[rank] = [[event, step, times]]

    def retime(self, rank: int) -> None:
        """`rank` has just started or stopped moving data: its kernels that started at this
        instant take the time they would take starting now."""
        env = self.env
        if self.at[rank] != env._now:  # type: ignore[attr-defined]
            return
        for record in self.started[rank]:
            event, step, times = record
            callbacks = event.callbacks
            if callbacks is None:  # over already (it took no time)
                continue
            fresh = env.timeout(self._seconds(rank, step, times))
            fresh.callbacks, event.callbacks = callbacks, []
            record[0] = fresh

    def _seconds(self, rank: int, step: Step, times: list[float] | None) -> float:
        """The seconds of `step` starting now, in the replay's own arithmetic
        (`sim.engine.replay._Replay._stream`); a run's `times` rewritten."""
        kind, i, op, _, _, extra, more, flag = step
        rates = self.rates
        by_kernel = rates.per_kernel and rates.busy[rank]
        stretch, base, kernel_scale = rates.scale[rank], rates.base[rank], rates.kernel_scale
        if kind == KERNEL:
            return extra * kernel_scale(op) * base if by_kernel else extra * stretch
        assert times is not None
        kept, ops = self.kept.get(rank), self.ops[rank]
        run = range(i, i + extra) if flag & CONTIGUOUS else extra
        new = [times[0]]
        for j, seconds in zip(run, more):
            new.append(new[-1] + seconds * (1.0 if kept and kept[j] else
                                            kernel_scale(ops[j]) * base if by_kernel
                                            else stretch))
        times[:] = new
        return new[-1] - new[0]
