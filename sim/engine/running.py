"""The kernels running on each rank, re-timed whenever their rank starts or stops moving
data, so that a kernel runs slower exactly while a transfer of its rank is in flight, and the
interference model's stretch does not depend on the order in which the engine resumes the
streams within one timestamp (issue 33).

The rule (`sim.models.interference`): a kernel does its work at 1 / kernel_scale(op) of its
speed alone while its rank has a transfer in flight, over [start, end) of the transfer: one
that starts at the instant a transfer starts is beside it from its start, one that starts at
the instant a transfer ends is not. The replay times a kernel (or a run of kernels,
`sim.engine.steps`) for the rank's state when it starts (`sim.engine.occupancy`) and notes it
here; when the rank's state flips, each of its kernel steps still running is timed again:
the work left of the kernel in progress at the rate it now has, the kernels after it from
their time alone. A new timeout then takes over the old one's callbacks (the old one fires
for nobody), and a run's times are rewritten in place (the replay reads them when it ends).
A step that starts at the instant of the flip is timed in the replay's own float products
and sums, so the two orders of one timestamp give the same bits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import simpy

from sim.engine.steps import CONTIGUOUS, KERNEL
from traces.ops import Op


class Rates(Protocol):
    """What re-timing reads of `sim.engine.occupancy.Occupancy`: the rank's state now."""

    busy: dict[int, int]
    scale: dict[int, float]
    base: dict[int, float]
    per_kernel: bool
    kernel_stretch: float

    def kernel_scale(self, op: Op) -> float: ...


class Running:
    """Per rank, a slot per stream for the kernel step it runs (a stream runs one at a time):
    [event, step, times, start, end], the timeout it waits on, its step, for a run the list
    of its kernels' starts and its end (None for one kernel), and for one kernel its start
    and end. The replay fills a slot in place as each kernel step starts (no allocation)."""

    def __init__(self, env: simpy.Environment, rates: Rates, ranks: Iterable[int],
                 ops: Mapping[int, Sequence[Op]], kept: Mapping[int, list[bool]]) -> None:
        self.env, self.rates, self.ops, self.kept = env, rates, ops, kept
        self.slots: dict[int, list[list[Any]]] = {r: [] for r in ranks}

    def slot(self, rank: int) -> list[Any]:
        """A new stream of `rank`'s slot."""
        slot: list[Any] = [None, None, None, 0.0, 0.0]
        self.slots[rank].append(slot)
        return slot

    def retime(self, rank: int) -> None:
        """`rank` has just started or stopped moving data: its running kernels take the
        time they have left at the rate they now have."""
        env = self.env
        now = env._now  # type: ignore[attr-defined]
        for slot in self.slots[rank]:
            event = slot[0]
            if event is None or event.callbacks is None:  # none yet, or over
                continue
            times = slot[2]
            if (slot[4] if times is None else times[-1]) <= now:  # it ends now
                continue
            fresh = env.timeout(self._left(rank, slot, now))
            fresh.callbacks, event.callbacks = event.callbacks, []
            slot[0] = fresh

    def _left(self, rank: int, slot: list[Any], now: float) -> float:
        """The seconds from `now` to the end of the slot's step in the rank's state now, its
        times rewritten: the kernel in progress keeps the work it has done."""
        _, step, times, start, end = slot
        kind, i, op, _, _, extra, more, flag = step
        rates = self.rates
        busy, base = rates.busy[rank], rates.base[rank]
        by_kernel = rates.per_kernel and busy
        if kind == KERNEL:
            if start == now:  # the replay's own product
                seconds = extra * rates.kernel_scale(op) * base if by_kernel else \
                    extra * rates.scale[rank]
            else:
                seconds = (end - now) / self._factor(rank, op, not busy) * \
                    self._factor(rank, op, bool(busy))
            slot[4] = now + seconds
            return seconds
        kept, ops = self.kept.get(rank), self.ops[rank]
        run = list(range(i, i + extra) if flag & CONTIGUOUS else extra)
        k = next(n for n in range(len(run)) if times[n + 1] > now)  # the one in progress
        if times[k] != now:  # part done: its work left at the new rate
            j = run[k]
            times[k + 1] = now + ((times[k + 1] - now)
                                  / self._factor(rank, ops[j], not busy, kept, j)
                                  * self._factor(rank, ops[j], bool(busy), kept, j))
            k += 1
        for n in range(k, len(run)):  # from their start: the replay's own sums
            j = run[n]
            times[n + 1] = times[n] + more[n] * (
                1.0 if kept and kept[j] else
                rates.kernel_scale(ops[j]) * base if by_kernel else rates.scale[rank])
        return times[-1] - now

    def _factor(self, rank: int, op: Op, busy: bool, kept: list[bool] | None = None,
                j: int = -1) -> float:
        """How many times as long as alone kernel `op` takes in state `busy` (1: kept)."""
        rates = self.rates
        if kept and kept[j]:
            return 1.0
        if not busy:
            return rates.base[rank]
        if rates.per_kernel:
            return rates.kernel_scale(op) * rates.base[rank]
        return rates.kernel_stretch * rates.base[rank]
