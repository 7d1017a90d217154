"""Events that are mostly superseded before their time, kept beside simpy's queue.

The flow network schedules every transfer of a component again at each re-share, so most of
its events are replaced before they fall due (97% in a skewed MoE step). Making each one a
simpy timeout fills the main queue with dead entries. Here each entry keeps the key its
timeout would have had, (time, event id), in a heap of its own; the main queue holds a
`Due` stand-in under the key of the earliest entry only. The loop therefore reaches every live
entry at the very place in its order the timeout would have had, while superseded entries
(their item's `version` moved on) are dropped without ever being events.

    dues = DueHeap(env, act)                        # act(item, version, flag) when one falls due
    dues.push(when, eid, item, item.version, flag)  # one entry; or, for many at once:
    heap = dues.trimmed(); heappush(heap, ...); dues.queue_if_earliest(first)
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Any

import simpy
from simpy.events import NORMAL

COMPACT_FROM = 4096
"""Entries from which the superseded are dropped at once (`DueHeap.trimmed`), and again each
time the heap has doubled since."""

Entry = tuple[float, int, Any, int, bool]
"""(time, event id, item, the item's version when pushed, the caller's flag)."""


class Due:
    """The main queue's stand-in for the heap's earliest entry: an event simpy's and `Loop`'s
    step can process (callbacks, `_ok`), nothing more."""

    __slots__ = ("callbacks", "_ok", "_value", "eid")

    def __init__(self, callback: Callable[[Due], None], eid: int) -> None:
        self.callbacks, self._ok, self._value, self.eid = [callback], True, None, eid


class DueHeap:
    """Versioned entries in their own heap, one `Due` on the main queue for the earliest; an
    entry is live while its item's `version` equals the version it was pushed with."""

    __slots__ = ("env", "heap", "proxied", "compact_at", "act")

    def __init__(self, env: simpy.Environment, act: Callable[[Any, int, bool], None]) -> None:
        self.env = env
        self.heap: list[Entry] = []
        self.proxied: set[int] = set()
        """Event ids of the entries with a `Due` on the main queue."""
        self.compact_at = COMPACT_FROM
        self.act = act
        """Called as act(item, version, flag) when a live entry falls due."""

    def push(self, when: float, eid: int, item: Any, version: int, flag: bool) -> None:
        """One entry, with a `Due` on the main queue if it is the new earliest."""
        heap = self.heap
        if not heap or when < heap[0][0] or (when == heap[0][0] and eid < heap[0][1]):
            self.queue(when, eid)
        heappush(heap, (when, eid, item, version, flag))

    def trimmed(self) -> list[Entry]:
        """The heap, its superseded entries first dropped where it has grown past
        `compact_at`: for a caller pushing many entries itself (then `queue_if_earliest`)."""
        if len(self.heap) > self.compact_at:
            self._compact()
        return self.heap

    def queue_if_earliest(self, before: tuple[float, int] | None) -> None:
        """A `Due` for the heap's top if it is earlier than `before`, the top's key before the
        caller's pushes (None: the heap was empty)."""
        top = self.heap[0]
        if before is None or top[0] < before[0] or (top[0] == before[0] and top[1] < before[1]):
            self.queue(top[0], top[1])

    def queue(self, when: float, eid: int) -> None:
        """Put a `Due` for the entry (when, eid) on the main queue, under its key."""
        self.proxied.add(eid)
        queue: list[Any] = self.env._queue  # type: ignore[attr-defined]  # holds a `Due`
        heappush(queue, (when, NORMAL, eid, Due(self._on_due, eid)))

    def _compact(self) -> None:
        """Drop the superseded entries at once (else each waits until it is the earliest: a
        heap of mostly dead entries makes every push and pop slower), and queue a `Due` for
        the earliest live one where it has none (a dropped entry's `Due` finds another entry
        first and does nothing: `_on_due`)."""
        heap = self.heap = [e for e in self.heap if e[3] == e[2].version]
        heapify(heap)
        self.compact_at = max(COMPACT_FROM, 2 * len(heap))
        if heap and heap[0][1] not in self.proxied:
            self.queue(heap[0][0], heap[0][1])

    def _on_due(self, proxy: Due) -> None:
        """The main queue has reached the heap's earliest entry (unless it was dropped as
        superseded meanwhile): queue the next live entry's `Due`, then act on this one."""
        heap, proxied = self.heap, self.proxied
        proxied.discard(proxy.eid)
        if not heap or heap[0][1] != proxy.eid:
            return  # its entry was superseded and dropped
        _, _, item, version, flag = heappop(heap)
        while heap and heap[0][3] != heap[0][2].version:  # superseded: never an event
            proxied.discard(heappop(heap)[1])
        if heap and heap[0][1] not in proxied:
            self.queue(heap[0][0], heap[0][1])
        if version == item.version:
            self.act(item, version, flag)
