"""Flow-level network model on simpy: transfers share links by max-min fairness.

A `FlowSet` is a group of routed flows that move in lock-step at one rate (see `sim.maxmin`).
`Network.transfer(flows, bytes_per_flow)` waits the set's latency, then moves the bytes while
sharing every link with all other transfers in flight. Whenever a transfer starts or ends, the
rates of the transfers connected to it through shared links (its *component*) are recomputed;
transfers elsewhere keep their rates. A link therefore costs `latency + bytes / share`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import simpy

from sim.maxmin import max_min_rates


@dataclass(frozen=True, slots=True)
class FlowSet:
    """Flows moving in lock-step: `counts[k]` flows cross link `links[k]`."""

    links: tuple[int, ...]
    counts: tuple[int, ...]
    latency_s: float
    solo_rate: float
    """Per-flow rate when nothing else is on the network (bytes/s)."""

    @staticmethod
    def of(routes: Iterable[Sequence[int]], latency_s: float,
           capacity: Sequence[float]) -> FlowSet:
        """Aggregate routes (tuples of link ids) into per-link flow counts."""
        counts: dict[int, int] = {}
        for route in routes:
            for link in route:
                counts[link] = counts.get(link, 0) + 1
        links = tuple(sorted(counts))
        per_link = tuple(counts[link] for link in links)
        solo = min((capacity[link] / n for link, n in zip(links, per_link)), default=float("inf"))
        return FlowSet(links, per_link, latency_s, solo)


@dataclass(eq=False, slots=True)
class _Transfer:
    seq: int
    flows: FlowSet
    remaining: float
    done: simpy.Event
    rate: float = 0.0
    since: float = 0.0
    version: int = 0


class Network:
    """All transfers in flight on one cluster's links."""

    def __init__(self, env: simpy.Environment, capacity: Sequence[float]) -> None:
        self.env = env
        self.capacity = capacity
        self._users: dict[int, dict[_Transfer, None]] = {}
        self._seq = 0
        self.num_reshares = 0

    def transfer(self, flows: FlowSet, bytes_per_flow: float) -> simpy.Event:
        """An event that fires when every flow of `flows` has carried `bytes_per_flow`."""
        self._seq += 1
        t = _Transfer(self._seq, flows, float(bytes_per_flow), self.env.event())
        if flows.latency_s > 0:
            self.env.timeout(flows.latency_s).callbacks.append(lambda _: self._start(t))
        else:
            self._start(t)
        return t.done

    def _start(self, t: _Transfer) -> None:
        if t.remaining <= 0 or not t.flows.links:
            t.done.succeed()
            return
        t.since = self.env.now
        shared = False
        for link in t.flows.links:
            users = self._users.setdefault(link, {})
            shared = shared or bool(users)
            users[t] = None
        self._reshare(self._component([t]) if shared else [t])

    def _component(self, seeds: Iterable[_Transfer]) -> list[_Transfer]:
        """Transfers reachable from `seeds` through shared links, in start order."""
        seen: dict[_Transfer, None] = {}
        stack = list(seeds)
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen[t] = None
            for link in t.flows.links:
                stack.extend(u for u in self._users[link] if u not in seen)
        return sorted(seen, key=lambda t: t.seq)

    def _reshare(self, component: list[_Transfer]) -> None:
        self.num_reshares += 1
        now = self.env.now
        for t in component:
            t.remaining = max(t.remaining - t.rate * (now - t.since), 0.0)
            t.since = now
        if len(component) == 1:
            rates = [component[0].flows.solo_rate]
        else:
            rates = max_min_rates([(t.flows.links, t.flows.counts) for t in component],
                                  self.capacity)
        for t, rate in zip(component, rates):
            if rate == t.rate and t.version:
                continue
            t.rate = rate
            t.version += 1
            version = t.version
            self.env.timeout(t.remaining / rate).callbacks.append(
                lambda _, t=t, version=version: self._finish(t, version)
            )

    def _finish(self, t: _Transfer, version: int) -> None:
        if version != t.version:
            return  # superseded by a later re-share
        neighbours: dict[_Transfer, None] = {}
        for link in t.flows.links:
            users = self._users[link]
            del users[t]
            neighbours.update(users)
            if not users:
                del self._users[link]
        t.remaining = 0.0
        t.done.succeed()
        if neighbours:
            self._reshare(self._component(neighbours))
