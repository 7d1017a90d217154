"""Flow-level network model on simpy: transfers share links by max-min fairness.

A `FlowSet` is a group of routed flows that move in lock-step at one rate (see `sim.maxmin`).
A transfer of a flow set first waits the set's latency, then moves its bytes while sharing
every link with all other transfers in flight, so a link costs `latency + bytes / share`.
`Network.run(lowering, size)` runs a collective's phases one after another.

Rates change only when a transfer starts moving or ends, and only for the transfers connected
to it through shared links (its *component*). Which flow sets share links is worked out once
per flow set, so a transfer alone on its links costs one event and no fairness computation.

A collective whose phases each have one flow set and which starts with nothing else on any
of its links runs on the analytic path: one event at its alpha-beta end time (the flow model's
answer when nothing interferes). If another transfer arrives on its links meanwhile, it is
turned back into flow transfers at the point it had reached, and shares from then on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import simpy

from sim.maxmin import max_min_matrix, max_min_rates

# A lowering: phases run one after another; in each, (flow set, bytes per flow / size) pairs.
Lowering = tuple[tuple[tuple["FlowSet", float], ...], ...]


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
        return FlowSet.from_counts(counts, latency_s, capacity)

    @staticmethod
    def from_counts(counts: dict[int, int], latency_s: float,
                    capacity: Sequence[float]) -> FlowSet:
        links = tuple(sorted(counts))
        per_link = tuple(counts[link] for link in links)
        solo = min((capacity[link] / n for link, n in zip(links, per_link)), default=float("inf"))
        return FlowSet(links, per_link, latency_s, solo)


@dataclass(eq=False, slots=True)
class _Plan:
    """What `Network.run` keeps per lowering: its flow sets' indices and whom they conflict
    with (refreshed when new flow sets register), and its analytic time per size."""

    lowering: Lowering
    indices: tuple[int, ...]
    conflicts: tuple[int, ...] = ()
    registry_size: int = -1
    seconds: dict[float, float] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class _Job:
    """A collective on the analytic path: its phase boundaries are known in advance."""

    lowering: Lowering
    size: float
    indices: tuple[int, ...]
    start: float
    done: simpy.Event
    live: bool = True


@dataclass(eq=False, slots=True)
class _Transfer:
    seq: int
    index: int
    """Dense index of its flow set in the network's registry."""
    remaining: float
    ready_at: float
    """When its latency has passed and its bytes start to move."""
    on_done: Callable[[], None]
    rate: float = 0.0
    since: float = 0.0
    version: int = 0


class Network:
    """All transfers in flight on one cluster's links."""

    def __init__(self, env: simpy.Environment, capacity: Sequence[float], *,
                 analytic_path: bool = True) -> None:
        self.env = env
        self.capacity = capacity
        self.analytic_path = analytic_path
        self._index: dict[int, int] = {}  # id(flow set) -> dense index
        self._sets: list[FlowSet] = []  # keeps registered flow sets (and their ids) alive
        self._conflicts: list[list[int]] = []  # flow sets sharing a link, itself included
        self._by_link: dict[int, list[int]] = {}
        self._active: list[dict[_Transfer, None]] = []
        self._jobs: list[dict[_Job, None]] = []  # analytic-path jobs per flow set
        self._plans: dict[int, _Plan | None] = {}  # id(lowering) -> plan, None: no fast path
        self._matrices: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._dirty: dict[_Transfer, None] = {}  # to re-share once the current instant is over
        self._seq = 0
        self.num_reshares = 0

    def run(self, lowering: Lowering, size_bytes: float) -> simpy.Event:
        """An event that fires when the lowering's last phase has finished."""
        done = self.env.event()
        plan = self._plans.get(id(lowering), 0)
        if plan == 0:
            plan = self._plan(lowering)
        if plan is not None and size_bytes > 0:
            if plan.registry_size != len(self._sets):  # new flow sets may conflict with it
                plan.conflicts = tuple(sorted({j for i in plan.indices
                                               for j in self._conflicts[i]}))
                plan.registry_size = len(self._sets)
            active, jobs = self._active, self._jobs
            if not any(active[j] or jobs[j] for j in plan.conflicts):
                self._analytic(plan, _Job(lowering, size_bytes, plan.indices, self.env.now, done))
                return done
        self._phase(lowering, 0, size_bytes, done)
        return done

    def _plan(self, lowering: Lowering) -> _Plan | None:
        plan = None
        if self.analytic_path and all(len(phase) == 1 for phase in lowering):
            indices = tuple(self._register(phase[0][0]) for phase in lowering)
            plan = _Plan(lowering, indices)
        self._plans[id(lowering)] = plan  # the plan holds the lowering, so its id stays unique
        return plan

    def _analytic(self, plan: _Plan, job: _Job) -> None:
        for i in set(job.indices):
            self._jobs[i][job] = None
        seconds = plan.seconds.get(job.size)
        if seconds is None:
            seconds = sum(flows.latency_s + factor * job.size / flows.solo_rate
                          for ((flows, factor),) in job.lowering)
            plan.seconds[job.size] = seconds
        self.env.timeout(seconds).callbacks.append(lambda _: self._end_analytic(job))

    def _end_analytic(self, job: _Job) -> None:
        if job.live:
            self._drop(job)
            job.done.succeed()

    def _drop(self, job: _Job) -> None:
        job.live = False
        for i in job.indices:
            self._jobs[i].pop(job, None)

    def _to_flows(self, job: _Job) -> None:
        """Continue an analytic job as flow transfers from where it has got to by now."""
        self._drop(job)
        now, t = self.env.now, job.start
        for k, ((flows, factor),) in enumerate(job.lowering):
            size = factor * job.size
            end = t + flows.latency_s + size / flows.solo_rate
            if end > now or k == len(job.lowering) - 1:
                break
            t = end
        ready = t + flows.latency_s
        moved = flows.solo_rate * (now - ready) if now > ready else 0.0
        index = job.indices[k]
        self._seq += 1

        def phase_done(k: int = k) -> None:
            self._phase(job.lowering, k + 1, job.size, job.done)

        tr = _Transfer(self._seq, index, max(size - moved, 0.0), ready, phase_done)
        tr.rate, tr.since = flows.solo_rate, max(now, ready)
        self._active[index][tr] = None
        self._schedule(tr, max(tr.since - now, 0.0) + tr.remaining / tr.rate)

    def transfer(self, flows: FlowSet, bytes_per_flow: float) -> simpy.Event:
        """An event that fires when every flow of `flows` has carried `bytes_per_flow`."""
        done = self.env.event()
        self._start(flows, bytes_per_flow, lambda: done.succeed())
        return done

    def _phase(self, lowering: Lowering, k: int, size: float, done: simpy.Event) -> None:
        if k == len(lowering):
            done.succeed()
            return
        pending = [len(lowering[k])]

        def one_done() -> None:
            pending[0] -= 1
            if pending[0] == 0:
                self._phase(lowering, k + 1, size, done)

        for flows, factor in lowering[k]:
            self._start(flows, factor * size, one_done)

    # --- registry of flow sets and who conflicts with whom --------------------------------

    def _register(self, flows: FlowSet) -> int:
        index = self._index.get(id(flows))
        if index is not None:
            return index
        index = len(self._sets)
        self._index[id(flows)] = index
        self._sets.append(flows)
        others: set[int] = set()
        for link in flows.links:
            users = self._by_link.setdefault(link, [])
            others.update(users)
            users.append(index)
        for j in others:
            self._conflicts[j].append(index)
        self._conflicts.append(sorted(others) + [index])
        self._active.append({})
        self._jobs.append({})
        return index

    # --- transfers ----------------------------------------------------------------------

    def _start(self, flows: FlowSet, size: float, on_done: Callable[[], None]) -> None:
        now = self.env.now
        if size <= 0 or not flows.links:
            if flows.latency_s > 0:
                self.env.timeout(flows.latency_s).callbacks.append(lambda _: on_done())
            else:
                on_done()
            return
        index = self._register(flows)
        for j in self._conflicts[index]:
            for job in list(self._jobs[j]):
                self._to_flows(job)
        self._seq += 1
        t = _Transfer(self._seq, index, float(size), now + flows.latency_s, on_done)
        active = self._active
        alone = not any(active[j] for j in self._conflicts[index])
        active[index][t] = None
        if alone:  # nobody else on its links: its own bottleneck rate until something changes
            t.rate, t.since = flows.solo_rate, t.ready_at
            self._schedule(t, t.ready_at + t.remaining / t.rate - now)
        else:
            self._mark([t])

    def _neighbours(self, t: _Transfer) -> Iterable[_Transfer]:
        for j in self._conflicts[t.index]:
            yield from self._active[j]

    def _component(self, seeds: Iterable[_Transfer]) -> list[_Transfer]:
        """Active transfers reachable from `seeds` through shared links, in start order."""
        seen: dict[_Transfer, None] = {}
        stack = list(seeds)
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen[t] = None
            stack.extend(u for u in self._neighbours(t) if u not in seen)
        return sorted(seen, key=lambda t: t.seq)

    def _reshare(self, component: list[_Transfer]) -> None:
        """Bring the component's progress up to now and give its moving transfers fair rates;
        transfers still in their latency wake up when it ends."""
        self.num_reshares += 1
        now = self.env.now
        moving = []
        for t in component:
            if now > t.since:
                t.remaining = max(t.remaining - t.rate * (now - t.since), 0.0)
            t.since = max(now, t.since)
            if t.ready_at <= now:
                moving.append(t)
            else:
                t.rate, t.since = 0.0, t.ready_at
                self._schedule(t, t.ready_at - now, wake=True)
        if not moving:
            return
        if len(moving) == 1:
            rates = [self._sets[moving[0].index].solo_rate]
        else:
            rates = self._rates(tuple(t.index for t in moving))
        for t, rate in zip(moving, rates):
            t.rate = rate
            self._schedule(t, t.remaining / rate)

    def _rates(self, indices: tuple[int, ...]) -> Sequence[float]:
        """Max-min rates of flow sets moving together. Large components use a link-by-set
        count matrix, cached per combination (a training step repeats the same few)."""
        sets = [self._sets[i] for i in indices]
        if sum(len(fs.links) for fs in sets) < 64:
            return max_min_rates([(fs.links, fs.counts) for fs in sets], self.capacity)
        cached = self._matrices.get(indices)
        if cached is None:
            links = sorted({link for fs in sets for link in fs.links})
            row = {link: r for r, link in enumerate(links)}
            counts = np.zeros((len(links), len(sets)))
            for g, fs in enumerate(sets):
                for link, n in zip(fs.links, fs.counts):
                    counts[row[link], g] = n
            capacity = np.array([self.capacity[link] for link in links])
            cached = self._matrices[indices] = (counts, capacity)
        return max_min_matrix(*cached).tolist()

    def _schedule(self, t: _Transfer, delay: float, wake: bool = False) -> None:
        t.version += 1
        version = t.version
        callback = self._wake if wake else self._finish
        self.env.timeout(delay).callbacks.append(lambda _: callback(t, version))

    def _mark(self, transfers: Iterable[_Transfer]) -> None:
        """Re-share these transfers' components once every event of this instant has run, so
        that the channels of a collective starting or ending together cost one re-share."""
        if not self._dirty:
            self.env.timeout(0).callbacks.append(lambda _: self._flush())
        self._dirty.update(dict.fromkeys(transfers))

    def _flush(self) -> None:
        dirty, self._dirty = self._dirty, {}
        done: set[_Transfer] = set()
        for t in dirty:
            if t not in done and t in self._active[t.index]:
                component = self._component([t])
                done.update(component)
                self._reshare(component)

    def _wake(self, t: _Transfer, version: int) -> None:
        if version == t.version:
            self._mark([t])

    def _finish(self, t: _Transfer, version: int) -> None:
        if version != t.version:
            return  # superseded by a later re-share
        del self._active[t.index][t]
        t.remaining = 0.0
        neighbours = list(self._neighbours(t))
        t.on_done()
        if neighbours:
            self._mark(neighbours)
