"""A seeded Monte-Carlo of a whole run: failures by cause, checkpoints, restarts, lost work.

One run: W seconds of compute in cycles of τ compute + the checkpoint's stall; a checkpoint
is durable at the end of its stall (synchronous) or once its write has drained, `drain_s`
later (asynchronous: a failure while it drains loses the work back to the previous one).
Failures arrive as a Poisson process of the summed rate of every cause, at any time (during
checkpoints and restarts too, as in Daly's model); each picks its cause by rate. A failure
loses the wall time since the last durable checkpoint and costs its cause's restart; a
hardware cause also waits for a spare node (the pool of `spare_nodes`, each failed node back
after `repair_s`) or, without spares, for its repair. A failure during a restart starts the
restart again. A failure hangs with probability `hang_fraction` (found only by the
watchdog's timeout instead of at once); a loss spike also rolls back `rollback_s` of compute.

Between failures the cycles are counted, not stepped: a run costs O(failures), so two months
of 2-minute checkpoints over 200 runs take a fraction of a second. The same seed gives the
same numbers (numpy's PCG64, drawn in one fixed order).
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from sim.goodput import badput
from traces.errors import ConfigError

MAX_EVENTS = 5_000_000
"""Failures all runs together may draw: checked before the first run starts."""
MAX_DRAWS = 10_000_000
"""Failure times all runs together may draw, counted as they are drawn: the bound that holds
when the estimate `check_events` checks falls short (spares that run out, restarts that
failures keep striking)."""
MAX_MARKS = 2_000
"""Checkpoints of the traced run kept for the report (evenly sampled beyond)."""


@dataclass(frozen=True, slots=True)
class Cause:
    name: str
    rate_per_s: float
    restart_s: float
    """Its restart, without waiting for a spare or a repair."""
    hardware: bool
    hang_extra_s: float = 0.0
    """What a hang adds to the restart: the watchdog's timeout less a crash's detection."""
    rollback_s: float = 0.0
    """Compute rolled back beyond the last durable checkpoint (a loss spike's)."""
    phases: badput.Phases = ()
    """`restart_s` by badput category, in order (`sim.goodput.badput`); () is OTHER."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunModel:
    useful_s: float
    """Compute the target needs (the effective fraction's numerator)."""
    work_s: float
    """Compute to run: useful_s plus the silent-data-corruption checks."""
    interval_s: float
    stall_s: float
    drain_s: float
    causes: tuple[Cause, ...]
    spare_nodes: int
    repair_s: float
    hang_fraction: float = 0.0
    """The share of failures that hang (found by the watchdog), drawn per failure."""

    @property
    def rate_per_s(self) -> float:
        return sum(c.rate_per_s for c in self.causes)


@dataclass(kw_only=True)
class Trajectory:
    """The first run, for the report: progress points, failures, checkpoints."""

    points: list[tuple[float, float]] = field(default_factory=list)
    """(wall s, compute s done) at each turn of the curve."""
    failures: list[tuple[float, float, str]] = field(default_factory=list)
    """(wall s, compute s reached, cause)."""
    checkpoints: list[float] = field(default_factory=list)
    checkpoint_every: int = 1
    """Each kept mark stands for this many checkpoints."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    wall_times_s: np.ndarray
    interruptions: np.ndarray
    by_cause: dict[str, float]
    """Mean interruptions per run."""
    lost_s_by_cause: dict[str, float]
    """Mean wall seconds lost per run: work since the durable checkpoint plus the restart;
    "checkpoint" holds the stalls of checkpoints that were kept."""
    useful_s: float
    trajectory: Trajectory
    badput_s: dict[str, float] = field(default_factory=badput.empty)
    """Mean wall seconds per run by ml-goodput-measurement's badput category; with
    `useful_s` they sum to the mean wall time."""

    @property
    def effective_fraction(self) -> float:
        return self.useful_s / float(np.mean(self.wall_times_s))

    def fraction_interval(self, z: float = 1.96) -> tuple[float, float]:
        """A 95% confidence interval of the effective fraction (from the wall times')."""
        n = len(self.wall_times_s)
        mean = float(np.mean(self.wall_times_s))
        se = float(np.std(self.wall_times_s, ddof=1)) / math.sqrt(n) if n > 1 else 0.0
        return self.useful_s / (mean + z * se), self.useful_s / max(mean - z * se, 1e-300)


def check_events(model: RunModel, runs: int, expected_wall_s: float) -> None:
    """Refuse a Monte-Carlo that would draw more than MAX_EVENTS failures."""
    expected = runs * expected_wall_s * model.rate_per_s
    if not expected <= MAX_EVENTS:
        raise ConfigError(f"goodput: the Monte-Carlo would draw about {expected:,.0f} failures "
                          f"({runs} runs of {expected_wall_s / 86400:,.1f} days), more than "
                          f"{MAX_EVENTS:,}; ask for fewer --days, --tokens or runs")


def simulate_run(model: RunModel, *, runs: int, seed: int) -> Outcome:
    """`runs` independent runs of `model` from `seed`."""
    draws = _Draws(np.random.Generator(np.random.PCG64(seed)))
    names = [c.name for c in model.causes]
    total = max(model.rate_per_s, 1e-300)
    shares = np.cumsum([c.rate_per_s / total for c in model.causes]).tolist()
    walls, counts = np.empty(runs), np.empty(runs)
    by_cause = dict.fromkeys([*names, "checkpoint"], 0.0)
    lost = dict.fromkeys([*names, "checkpoint"], 0.0)
    trajectory = Trajectory()
    bad = badput.empty()
    bad[badput.CUSTOM] = model.work_s - model.useful_s  # the checks: the same in every run
    for i in range(runs):
        one = _Run(model, draws, shares, trajectory if i == 0 else None)
        walls[i], counts[i] = one.run()
        for category, seconds in one.badput.items():
            bad[category] += seconds / runs
        for name in names:
            by_cause[name] += one.count[name]  # whole counts: summed exactly, divided once
            lost[name] += one.lost[name] / runs
        lost["checkpoint"] += one.lost["checkpoint"] / runs
    del by_cause["checkpoint"]
    by_cause = {name: total / runs for name, total in by_cause.items()}
    return Outcome(wall_times_s=walls, interruptions=counts, by_cause=by_cause,
                   lost_s_by_cause=lost, useful_s=model.useful_s, trajectory=trajectory,
                   badput_s=bad)


class _Draws:
    """Standard exponential and uniform variates drawn from `rng` in blocks (one numpy call
    per block instead of one per failure); the same seed gives the same stream."""

    BLOCK = 4096

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.exp: list[float] = []
        self.uni: list[float] = []
        self.drawn = 0

    def exponential(self) -> float:
        if not self.exp:
            self.drawn += self.BLOCK
            if self.drawn > MAX_DRAWS:
                raise ConfigError(f"goodput: the Monte-Carlo drew {MAX_DRAWS:,} failure times "
                                  "without finishing its runs (failures outrun the restarts "
                                  "and repairs); ask for fewer runs, --days or --tokens")
            self.exp = self.rng.standard_exponential(self.BLOCK).tolist()[::-1]
        return self.exp.pop()

    def uniform(self) -> float:
        if not self.uni:
            self.uni = self.rng.random(self.BLOCK).tolist()[::-1]
        return self.uni.pop()


class _Run:
    """One run's state; `run()` returns (wall seconds, interruptions)."""

    def __init__(self, model: RunModel, draws: _Draws, shares: list[float],
                 trace: Trajectory | None) -> None:
        self.m, self.draws, self.shares, self.trace = model, draws, shares, trace
        self.count = {c.name: 0 for c in model.causes}
        self.lost = {c.name: 0.0 for c in model.causes} | {"checkpoint": 0.0}
        self.repairs: list[float] = []
        self.badput: dict[str, float] = {}
        self.t = 0.0
        self.done = 0.0
        if trace is not None:
            marks = math.ceil(model.work_s / model.interval_s)
            trace.checkpoint_every = max(1, math.ceil(marks / MAX_MARKS))
            trace.points.append((0.0, 0.0))
        self.marks = 0

    def next_failure(self) -> float:
        rate = self.m.rate_per_s
        return math.inf if rate <= 0 else self.draws.exponential() / rate

    def run(self) -> tuple[float, int]:
        m = self.m
        cycle = m.interval_s + m.stall_s
        while True:
            left = m.work_s - self.done
            n = max(1, math.ceil(left / m.interval_s - 1e-12))
            last = left - (n - 1) * m.interval_s
            finish = (n - 1) * cycle + last + m.stall_s + m.drain_s
            f = self.next_failure()
            if f >= finish:
                self._advance(n)
                badput.add(self.badput, badput.SAVE, m.drain_s)  # the last write drains
                self.t += finish
                self.done = m.work_s
                if self.trace is not None:
                    self.trace.points.append((self.t, self.done))
                return self.t, sum(self.count.values())
            k = min(int(f // cycle), n - 1)
            r = f - k * cycle
            durable = k - 1 if (k >= 1 and r < m.drain_s) else k
            reached = self.done + k * m.interval_s + min(r, last if k == n - 1 else m.interval_s)
            self._advance(durable)
            cause = self._cause()
            self.lost[cause.name] += f - durable * cycle
            badput.add(self.badput, badput.WASTED, f - durable * cycle)
            self.t += f
            self.done += durable * m.interval_s
            if cause.rollback_s > 0:  # the work back to the spike's checkpoint is redone
                back = min(cause.rollback_s, self.done)
                self.done -= back
                self.lost[cause.name] += back
                badput.add(self.badput, badput.WASTED, back)
            if self.trace is not None:
                self.trace.points += [(self.t, reached), (self.t, self.done)]
                self.trace.failures.append((self.t, reached, cause.name))
            self._restart(cause)

    def _advance(self, checkpoints: int) -> None:
        """Credit `checkpoints` kept checkpoints from now on."""
        self.lost["checkpoint"] += checkpoints * self.m.stall_s
        badput.add(self.badput, badput.SAVE, checkpoints * self.m.stall_s)
        if self.trace is None:
            return
        cycle = self.m.interval_s + self.m.stall_s
        every = self.trace.checkpoint_every
        first = -self.marks % every or every  # the first of these checkpoints that is kept
        for j in range(first, checkpoints + 1, every):  # only the kept ones, one by one
            self.trace.checkpoints.append(self.t + j * cycle)
        self.marks += checkpoints

    def _cause(self) -> Cause:
        # the first cause whose cumulative share exceeds a uniform draw
        index = min(bisect.bisect_right(self.shares, self.draws.uniform()),
                    len(self.m.causes) - 1)
        cause = self.m.causes[index]
        self.count[cause.name] += 1
        return cause

    def _restart(self, cause: Cause) -> None:
        """Restart after `cause` (again, each time a failure strikes the restart)."""
        while True:
            wait = self._wait(cause) if cause.hardware else 0.0
            duration = cause.restart_s + wait
            hang = 0.0
            if self.m.hang_fraction > 0 and self.draws.uniform() < self.m.hang_fraction:
                hang = cause.hang_extra_s
                duration = max(0.0, duration + hang)
            phases = ((badput.INFRASTRUCTURE, wait + max(hang, 0.0)),
                      *(cause.phases or ((badput.OTHER, cause.restart_s),)))
            g = self.next_failure()
            badput.split(phases, min(g, duration), self.badput)
            if g >= duration:
                self.lost[cause.name] += duration
                self.t += duration
                if self.trace is not None:
                    self.trace.points.append((self.t, self.done))
                return
            self.lost[cause.name] += g
            self.t += g
            cause = self._cause()

    def _wait(self, cause: Cause) -> float:
        """How long a hardware failure at `self.t` waits for a node."""
        m = self.m
        if m.spare_nodes == 0:
            return m.repair_s
        while self.repairs and self.repairs[0] <= self.t:
            heapq.heappop(self.repairs)
        wait = 0.0
        if len(self.repairs) >= m.spare_nodes:
            wait = heapq.heappop(self.repairs) - self.t
        heapq.heappush(self.repairs, self.t + m.repair_s)
        return wait
