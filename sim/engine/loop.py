"""A lean simpy environment: the same events in the same order, fewer Python calls per event.

    env = Loop()
    env.start(generator)       # a process nobody waits on (no Process object, no end event)
    env.timeout(seconds)       # as simpy's, built without its layers of calls
    env.event()                # likewise
    env.run()                  # simpy's step loop, inlined

The replay makes ~4·10^5 events for GPT-3 on 1024 GPUs; simpy spends most of its time per
event in calls (Timeout.__init__ → schedule → heappush; run → step; Process._resume). Here
each is one function. Every event keeps simpy's key (time, priority, eid), so the heap pops
events in exactly the order simpy would, and callbacks run in the order they were added:
the replay's times are the same floats. `process`, `event` and conditions are simpy's own.
"""

from __future__ import annotations

from collections.abc import Generator
from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.events import NORMAL, URGENT

_Timeout, _Event = simpy.Timeout, simpy.Event


class Loop(simpy.Environment):
    """A `simpy.Environment` with a faster `timeout`, `start` and `run` (see the module)."""

    def timeout(self, delay: float = 0, value: Any = None) -> simpy.Timeout:  # type: ignore[override]
        if delay < 0:
            raise ValueError(f"Negative delay {delay}")
        event = _Timeout.__new__(_Timeout)
        event.env, event.callbacks, event._delay, event._ok, event._value = \
            self, [], delay, True, value
        heappush(self._queue, (self._now + delay, NORMAL, next(self._eid), event))
        return event

    def event(self) -> simpy.Event:
        """As simpy's: a pending event (its `Event.__init__`, inlined)."""
        event = _Event.__new__(_Event)
        event.env, event.callbacks = self, []
        return event

    def start(self, generator: Generator[simpy.Event, Any, None]) -> None:
        """Run `generator` as a process from now, like `process` (its start is an urgent
        event, as simpy's Initialize), but nobody can wait for its end: it has none."""
        send = generator.send

        def resume(event: simpy.Event) -> None:
            while True:
                try:
                    event = send(event._value)
                except StopIteration:
                    return
                callbacks = event.callbacks
                if callbacks is not None:  # not yet processed: resume when it is
                    callbacks.append(resume)
                    return

        first = simpy.Event(self)
        first._ok, first._value = True, None
        first.callbacks.append(resume)
        heappush(self._queue, (self._now, URGENT, next(self._eid), first))

    def run(self, until: Any = None) -> Any:
        """Process every event (simpy's `step`, inlined); with `until`, simpy's own `run`."""
        if until is not None:
            return super().run(until)
        queue = self._queue
        while queue:
            self._now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc
        return None


__all__ = ["Loop"]
