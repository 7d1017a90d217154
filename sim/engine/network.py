"""Flow-level network model on simpy: transfers share links by max-min fairness.

It moves the values of `sim.engine.flows`: a transfer of a `FlowSet` first waits the set's
latency, then moves its bytes while sharing every link with all other transfers in flight, so a
link costs `latency + bytes / share`; a `Lowering` runs its rounds one after another.

    handle = net.register(lowering)       # once per lowering
    done = net.run(handle, size, stretch) # per collective: an event when its bytes have moved

Rates change only when a transfer starts or ends, and only for the transfers that share links
with it; a transfer alone on its links runs on an analytic path (one event) until another
arrives. Every cache lives as long as the `Network` and only grows.

In full: docs/engine.md ("The flow network").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from heapq import heappush
from operator import attrgetter

import numpy as np
import simpy
from simpy.events import NORMAL

from sim.engine.due_heap import DueHeap
from sim.engine.flows import FlowSet, Lowering, solo_time
from sim.engine.maxmin import max_min_matrix, max_min_rates

WIDE_SET = 4096
"""Links from which a flow set (a collective over thousands of servers) is registered as a
whole, its links in one frozenset, not in every link's list of users: the sets it conflicts
with are the same, found without a million list appends."""


@dataclass(eq=False, slots=True)
class _Plan:
    """What the network keeps per registered lowering (see the module's cache rules)."""

    lowering: Lowering
    index: list[list[int]]
    """Registry index per round and flow set; -1 until the set is first used."""
    analytic: bool
    """Every round has one flow set: it may take the analytic path."""
    indices: tuple[int, ...] = ()
    """Analytic lowerings: the one flow set's index per round (set at the first run)."""
    distinct: tuple[int, ...] = ()
    """`indices` without repeats."""
    conflicts: frozenset[int] = frozenset()
    registry_size: int = -1
    seconds: dict[float, float] = field(default_factory=dict)


class _Job(simpy.Event):
    """A collective on the analytic path (its round boundaries are known in advance), and
    the event that fires when it is done (one object: `run` makes ~10^5)."""

    plan: _Plan
    size: float
    start: float
    stretch: float
    live: bool


_new = object.__new__
_SEQ = attrgetter("seq")


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
                 analytic_path: bool = True, timeouts: bool = False) -> None:
        self.env = env
        self.capacity = tuple(capacity)
        assert all(0 < c < math.inf for c in self.capacity), "link capacities must be finite > 0"
        self.analytic_path = analytic_path
        self._handles: dict[Lowering, int] = {}
        self._plans: list[_Plan] = []
        self._index: dict[FlowSet, int] = {}
        self._sets: list[FlowSet] = []
        self._conflicts: list[list[int]] = []  # flow sets sharing a link, itself included
        self._near: list[set[int]] = []  # the same, as sets (`_component`)
        self._live: set[int] = set()  # flow sets with transfers in flight
        self._live_near: dict[int, set[int]] = {}
        """Per flow set in flight, those of `_near` in flight (itself included): kept as sets
        go in and out of flight (`_go_live`, `_go_idle`), so that finding a component walks
        only its own sets, never the whole of `_live`."""
        self._jobbed: set[int] = set()  # flow sets with analytic-path jobs in flight
        self._by_link: dict[int, list[int]] = {}
        """Flow sets by link, but for the wide ones (`WIDE_SET`), kept in `_wide`."""
        self._wide: list[tuple[int, frozenset[int]]] = []
        self._active: list[dict[_Transfer, None]] = []
        self._jobs: list[dict[_Job, None]] = []  # analytic-path jobs per flow set
        self._capacities = np.asarray(self.capacity, dtype=float)
        self._ids: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        """Per flow set, its links and counts as arrays (`_arrays`)."""
        self._shares: dict[tuple[int, ...], tuple[float, ...]] = {}
        """Max-min rates per combination of flow sets moving together (`_rates`)."""
        self._dirty: dict[_Transfer, None] = {}  # to re-share once the current instant is over
        self._timeouts = timeouts
        """Schedule every transfer event as its own simpy timeout (the reference `_schedule`
        is checked against), not on `_due`."""
        self._dues = DueHeap(env, self._act)
        """Transfer events (time, event id, transfer, version, wake) (`_schedule`)."""
        self._seq = 0
        self.num_reshares = 0

    def register(self, lowering: Lowering) -> int:
        """The handle `run` takes for this lowering (equal lowerings share one)."""
        handle = self._handles.get(lowering)
        if handle is None:
            handle = self._handles[lowering] = len(self._plans)
            index = [[-1] * len(rnd) for rnd in lowering]
            analytic = self.analytic_path and all(len(rnd) == 1 for rnd in lowering)
            self._plans.append(_Plan(lowering, index, analytic))
        return handle

    def run(self, handle: int, size_bytes: float, stretch: float = 1.0) -> simpy.Event:
        """An event that fires when the registered lowering's last round has finished (each
        latency and each byte counted `stretch` times). Called once per collective (~10^5
        for GPT-3 on 1024 GPUs), hence the analytic path inline."""
        env = self.env
        plan = self._plans[handle]
        if plan.analytic:
            if len(plan.indices) != len(plan.lowering):  # first run: index its flow sets
                plan.indices = tuple(self._index_of(plan, k, 0) for k in range(len(plan.index)))
                plan.distinct = tuple(set(plan.indices))
            if size_bytes > 0:
                if plan.registry_size != len(self._sets):  # new flow sets may conflict with it
                    plan.conflicts = frozenset({j for i in plan.indices
                                                for j in self._conflicts[i]})
                    plan.registry_size = len(self._sets)
                jobs = self._jobs
                if plan.conflicts.isdisjoint(self._live) and \
                        plan.conflicts.isdisjoint(self._jobbed):
                    # nothing on its links: one event at its time alone
                    job = _new(_Job)  # `_Job(env)`: simpy's Event.__init__, inlined
                    job.env, job.callbacks = env, []
                    job.plan, job.size, job.start, job.stretch, job.live = \
                        plan, size_bytes, env._now, stretch, True
                    for i in plan.distinct:
                        jobs[i][job] = None
                        self._jobbed.add(i)
                    seconds = plan.seconds.get(size_bytes)
                    if seconds is None:
                        seconds = plan.seconds[size_bytes] = solo_time(
                            plan.lowering, size_bytes, self.capacity)
                    env.timeout(seconds * stretch, job).callbacks.append(self._end_analytic)
                    return job
        done = env.event()
        self._round(plan, 0, size_bytes, done, stretch)
        return done

    def _end_analytic(self, timeout: simpy.Event) -> None:
        """The timeout of an analytic job (its value) has fired: the job is done, unless it
        went on as flows meanwhile.

        Done, the job is an event of this instant, after every one queued already. Where
        none is queued for this instant, it is the very next event the loop would pop: its
        callbacks run here and now instead, in the same order and at the same time, without
        the push and pop (~120,000 for GPT-3 on 1024 GPUs). This is the timeout's only
        callback, so nothing runs between the two either way; the id it does not take only
        shifts later events' ids by one, never their order."""
        job: _Job = timeout._value
        if job.live:  # _drop(job), then job.succeed(), without their layers of calls
            job.live = False
            jobs = self._jobs
            for i in job.plan.indices:
                jobs[i].pop(job, None)
                if not jobs[i]:
                    self._jobbed.discard(i)
            job._ok, job._value = True, None
            env = self.env
            queue = env._queue
            if queue and queue[0][0] <= env._now:  # env.schedule(job), inlined: the same key
                heappush(queue, (env._now + 0, NORMAL, next(env._eid), job))
            else:  # the loop's step of the job, inlined
                callbacks, job.callbacks = job.callbacks, None  # type: ignore[assignment]
                for callback in callbacks:
                    callback(job)

    def _drop(self, job: _Job) -> None:
        job.live = False
        for i in job.plan.indices:
            self._jobs[i].pop(job, None)
            if not self._jobs[i]:
                self._jobbed.discard(i)

    def _to_flows(self, job: _Job) -> None:
        """Continue an analytic job as flow transfers from where it has got to by now."""
        self._drop(job)
        plan, now, t, stretch = job.plan, self.env.now, job.start, job.stretch
        for k, ((flows, factor),) in enumerate(plan.lowering):
            whole = factor * job.size * stretch
            size = flows.per_qp(whole)  # what each of its queue pairs moves
            end = t + flows.solo_time(whole) + flows.latency_s * (stretch - 1.0)
            if end > now or k == len(plan.lowering) - 1:
                break
            t = end
        ready = t + flows.latency_s * stretch
        moved = flows.solo_rate * (now - ready) if now > ready else 0.0
        self._seq += 1

        def round_done(k: int = k) -> None:
            self._round(plan, k + 1, job.size, job, stretch)

        tr = _Transfer(self._seq, plan.indices[k], max(size - moved, 0.0), ready, round_done)
        tr.rate, tr.since = flows.solo_rate, max(now, ready)
        self._active[tr.index][tr] = None
        self._go_live(tr.index)
        self._schedule(tr, max(tr.since - now, 0.0) + tr.remaining / tr.rate)

    def _round(self, plan: _Plan, k: int, size: float, done: simpy.Event,
               stretch: float = 1.0) -> None:
        if k == len(plan.lowering):
            done.succeed()
            return
        rnd = plan.lowering[k]
        pending = [len(rnd)]

        def one_done() -> None:
            pending[0] -= 1
            if pending[0] == 0:
                self._round(plan, k + 1, size, done, stretch)

        for j, (_, factor) in enumerate(rnd):
            self._start(plan, k, j, factor * size, one_done, stretch)

    # --- registry of flow sets and who conflicts with whom --------------------------------

    def _index_of(self, plan: _Plan, k: int, j: int) -> int:
        index = plan.index[k][j]
        if index < 0:
            index = plan.index[k][j] = self._register(plan.lowering[k][j][0])
        return index

    def _register(self, flows: FlowSet) -> int:
        index = self._index.get(flows)
        if index is not None:
            return index
        index = self._index[flows] = len(self._sets)
        self._sets.append(flows)
        by_link = self._by_link
        others = {j for j, links in self._wide if not links.isdisjoint(flows.links)}
        if len(flows.links) > WIDE_SET:  # kept apart: its links are not listed one by one
            for link in flows.links:
                users = by_link.get(link)
                if users:
                    others.update(users)
            self._wide.append((index, frozenset(flows.links)))
        else:
            for link in flows.links:
                users = by_link.setdefault(link, [])
                others.update(users)
                users.append(index)
        for j in others:
            self._conflicts[j].append(index)
            self._near[j].add(index)
        self._conflicts.append(sorted(others) + [index])
        self._near.append({*others, index})
        self._active.append({})
        self._jobs.append({})
        return index

    # --- transfers ----------------------------------------------------------------------

    def _start(self, plan: _Plan, k: int, j: int, size: float,
               on_done: Callable[[], None], stretch: float = 1.0) -> None:
        """Start flow set j of round k of `plan`, each flow carrying `size` bytes (latency and
        bytes `stretch` times over)."""
        now = self.env.now
        flows = plan.lowering[k][j][0]
        latency, size = flows.latency_s * stretch, flows.per_qp(size * stretch)
        if size <= 0 or not flows.links:
            if latency > 0:
                self.env.timeout(latency).callbacks.append(lambda _: on_done())
            else:
                on_done()
            return
        index = self._index_of(plan, k, j)
        near = self._near[index]
        for c in sorted(near & self._jobbed):  # (`_conflicts[index]`'s order: ascending)
            for job in list(self._jobs[c]):
                self._to_flows(job)
        self._seq += 1
        t = _Transfer(self._seq, index, float(size), now + latency, on_done)
        active = self._active
        alone = self._go_live(index)
        active[index][t] = None
        if alone:  # nobody else on its links: its own bottleneck rate until something changes
            t.rate, t.since = flows.solo_rate, t.ready_at
            self._schedule(t, t.ready_at + t.remaining / t.rate - now)
        else:
            self._mark([t])

    def _go_live(self, index: int) -> bool:
        """Flow set `index` has a transfer in flight; whether none of `_near[index]` (itself
        included) had one before."""
        live = self._live
        if index in live:
            return False
        mine = self._near[index] & live
        live.add(index)
        live_near = self._live_near
        for j in mine:
            live_near[j].add(index)
        mine.add(index)
        live_near[index] = mine
        return len(mine) == 1

    def _go_idle(self, index: int) -> set[int]:
        """Flow set `index` has no transfer in flight any more; those sharing links with it
        that still have."""
        self._live.discard(index)
        live_near = self._live_near
        near = live_near.pop(index)
        near.discard(index)
        for j in near:
            live_near[j].discard(index)
        return near

    def _component(self, seeds: Iterable[_Transfer]) -> list[_Transfer]:
        """Active transfers reachable from `seeds` through shared links, in start order.
        Whether two transfers share links depends on their flow sets only, so the search
        walks flow sets, each once, through `_live_near`: those in flight sharing links with
        each (most of a registry's sets are idle at any instant, and most of those in flight
        are on other servers' links)."""
        active, near = self._active, self._live_near
        todo = list({t.index: None for t in seeds})
        reached = set(todo)
        while todo:
            hits = near[todo.pop()] - reached
            if hits:
                reached |= hits
                todo += hits
        return sorted([t for j in reached for t in active[j]], key=_SEQ)

    def _reshare(self, component: list[_Transfer]) -> None:
        """Bring the component's progress up to now and give its moving transfers fair rates;
        transfers still in their latency wake up when it ends."""
        self.num_reshares += 1
        now = self.env.now
        moving = []
        for t in component:
            since = t.since
            if now > since:  # (and then `since` becomes now: max(now, since))
                remaining = t.remaining - t.rate * (now - since)
                # max(remaining, 0.0) without the call (~10^7 for a skewed MoE step): the same
                # value, -0.0 and NaN included (max keeps its first argument unless it is below 0.0)
                t.remaining = 0.0 if remaining < 0.0 else remaining
                t.since = now
            if t.ready_at <= now:
                moving.append(t)
            else:
                t.rate, t.since = 0.0, t.ready_at
                self._schedule(t, t.ready_at - now, wake=True)
        if not moving:
            return
        if len(moving) == 1:
            rates: Sequence[float] = [self._sets[moving[0].index].solo_rate]
        else:
            rates = self._rates(tuple([t.index for t in moving]))
        if self._timeouts:
            for t, rate in zip(moving, rates):
                t.rate = rate
                self._schedule(t, t.remaining / rate)
        else:
            self._finish_all(moving, rates, now)

    def _finish_all(self, moving: list[_Transfer], rates: Sequence[float], now: float) -> None:
        """`_schedule(t, t.remaining / rate)` of each at its new rate, in order, inlined: the
        same times and event ids; a `_Due` for `_due`'s new earliest entry only (an entry
        that is not the earliest needs none until it is)."""
        due, eids = self._dues.trimmed(), self.env._eid
        first = (due[0][0], due[0][1]) if due else None
        for t, rate in zip(moving, rates):
            t.rate = rate
            t.version += 1
            heappush(due, (now + t.remaining / rate, next(eids), t, t.version, False))
        self._dues.queue_if_earliest(first)

    def _rates(self, indices: tuple[int, ...]) -> Sequence[float]:
        """Max-min rates of flow sets moving together, computed once per combination: they
        depend on the sets' links and the capacities alone, and a training step repeats the
        same few (a skewed 1,024-rank MoE step asks 41,158 times for 6,975 combinations).
        Large components use a link-by-set count matrix."""
        known = self._shares.get(indices)
        if known is None:
            known = self._shares[indices] = tuple(self._max_min(indices))
        return known

    def _max_min(self, indices: tuple[int, ...]) -> Sequence[float]:
        sets = [self._sets[i] for i in indices]
        if sum(len(fs.links) for fs in sets) < 64:
            return max_min_rates([(fs.links, fs.counts) for fs in sets], self.capacity)
        arrays = [self._arrays(i) for i in indices]
        ids = [links for links, _ in arrays]
        every = np.sort(np.concatenate(ids))  # sorted and distinct, as np.unique (sorting
        links = every[np.concatenate(([True], every[1:] != every[:-1]))]  # beats hashing)
        counts = np.zeros((len(links), len(sets)))
        for g, (on, n) in enumerate(arrays):
            counts[np.searchsorted(links, on), g] = n
        return max_min_matrix(counts, self._capacities[links]).tolist()

    def _arrays(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Flow set `index`'s links and counts as arrays, made once."""
        found = self._ids.get(index)
        if found is None:
            fs = self._sets[index]
            found = self._ids[index] = (np.asarray(fs.links, dtype=np.int64),
                                        np.asarray(fs.counts, dtype=float))
        return found

    def _schedule(self, t: _Transfer, delay: float, wake: bool = False) -> None:
        """Wake `t` (or finish it) in `delay` seconds, unless it is scheduled again before.

        Every re-share schedules each transfer of its component again, so most of these
        events are superseded before their time: they wait in `sim.engine.due_heap`'s heap
        under the key their simpy timeout would have had, and only live ones become events."""
        t.version += 1
        if self._timeouts:
            version = t.version
            callback = self._wake if wake else self._finish
            self.env.timeout(delay).callbacks.append(lambda _: callback(t, version))
            return
        env = self.env
        if delay < 0:
            raise ValueError(f"Negative delay {delay}")
        self._dues.push(env._now + delay, next(env._eid), t, t.version, wake)

    def _act(self, t: _Transfer, version: int, wake: bool) -> None:
        """A transfer event of `_dues` falls due: wake the transfer or finish it."""
        (self._wake if wake else self._finish)(t, version)

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
        index, active = t.index, self._active
        del active[index][t]
        near = self._go_idle(index) if not active[index] else self._live_near[index]
        t.remaining = 0.0
        neighbours = [u for j in sorted(near) for u in active[j]]  # `_conflicts`' order
        t.on_done()
        if neighbours:
            self._mark(neighbours)
