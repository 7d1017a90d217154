"""Flow sets and lowerings, the values the network moves, and their time alone on the network.

A `FlowSet` is a group of routed flows that move in lock-step at one rate (see `sim.engine.maxmin`):
`counts[k]` of them cross link `links[k]`. Where a connection is split over `qps` queue pairs
(NCCL_IB_QPS_PER_CONNECTION; ECMP hashes each onto its own path, `topology.fabric`), the
counts count queue pairs and each carries 1/qps of its flow's bytes; a cluster gives every
set the same `qps`, so sharing a link where the queue pairs do not spread is unchanged.
A `Lowering` (what `sim.collectives` makes of a collective) is a tuple of communication
*rounds* run one after another; a `Round` is a tuple of `(FlowSet, factor)`, every flow of
the set carrying `factor * size` bytes.

Alone on the network a flow set takes `FlowSet.solo_time(bytes)` = latency + bytes / its
bottleneck rate: the one alpha-beta formula of parasim. `solo_time(lowering, ...)` adds up a
lowering's rounds; algorithm selection (`sim.collectives`), the `analytic` network of the replay
and the flow model's shortcut (`sim.engine.network`) all use it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from sim.engine.maxmin import max_min_rates

Round = tuple[tuple["FlowSet", float], ...]
"""Flow sets moving together, each with its bytes per flow as a fraction of the size."""
Lowering = tuple[Round, ...]
"""Rounds run one after another (lock-step: a round starts when the previous one is done)."""


@dataclass(frozen=True, slots=True)
class FlowSet:
    """Flows moving in lock-step: `counts[k]` flows cross link `links[k]`."""

    links: tuple[int, ...]
    counts: tuple[int, ...]
    latency_s: float
    solo_rate: float
    """Per-queue-pair rate when nothing else is on the network (bytes/s)."""
    qps: int = 1
    """Queue pairs per flow: each moves `1 / qps` of the flow's bytes (`counts` count them)."""

    @staticmethod
    def of(routes: Iterable[Sequence[int]], latency_s: float,
           capacity: Sequence[float], qps: int = 1) -> FlowSet:
        """Aggregate routes (tuples of link ids; `qps` per flow) into per-link counts."""
        return FlowSet.from_counts(Counter(chain.from_iterable(routes)), latency_s, capacity,
                                   qps)

    @staticmethod
    def from_counts(counts: Mapping[int, int], latency_s: float,
                    capacity: Sequence[float], qps: int = 1) -> FlowSet:
        links = tuple(sorted(counts))
        per_link = tuple(counts[link] for link in links)
        solo = min((capacity[link] / n for link, n in zip(links, per_link)), default=math.inf)
        # Internal invariants (the config layer rejects such input): an infinite latency or a
        # zero rate would schedule events at infinity, and the re-share would never end.
        assert math.isfinite(latency_s) and latency_s >= 0, f"latency {latency_s!r} s"
        assert solo > 0 and (math.isfinite(solo) or not links), f"rate {solo!r} B/s"
        return FlowSet(links, per_link, latency_s, solo, qps)

    @staticmethod
    def from_arrays(links: np.ndarray, counts: np.ndarray, latency_s: float,
                    capacity: Sequence[float] | np.ndarray, qps: int = 1) -> FlowSet:
        """`from_counts` of `counts[k]` flows on each of the sorted `links[k]` (numpy): the
        same value, the same integers, the same divisions and their minimum."""
        assert (counts > 0).all(), "every link listed carries flows"
        solo = float((np.asarray(capacity, dtype=float)[links] / counts).min()) if len(links) \
            else math.inf
        assert math.isfinite(latency_s) and latency_s >= 0, f"latency {latency_s!r} s"
        assert solo > 0 and (math.isfinite(solo) or not len(links)), f"rate {solo!r} B/s"
        return FlowSet(tuple(links.tolist()), tuple(counts.tolist()), latency_s, solo, qps)

    def solo_time(self, bytes_per_flow: float) -> float:
        """Alpha-beta: the latency, then the bytes at the bottleneck rate, nothing else around."""
        return self.latency_s + self.per_qp(bytes_per_flow) / self.solo_rate

    def per_qp(self, bytes_per_flow: float) -> float:
        """The bytes one queue pair of a flow moves (all of them at one queue pair)."""
        return bytes_per_flow if self.qps == 1 else bytes_per_flow / self.qps


def solo_time(lowering: Lowering, size_bytes: float, capacity: Sequence[float]) -> float:
    """A lowering alone on the network: its rounds' times added up."""
    return sum(_round_time(rnd, size_bytes, capacity) for rnd in lowering)


def _round_time(rnd: Round, size_bytes: float, capacity: Sequence[float]) -> float:
    """A round alone: each flow set waits its latency, then shares links max-min fairly.

    One flow set takes its `solo_time`. Several (the channels of a ring, the chunks of a torus
    round) are stepped from one start or finish to the next, so a set that starts or ends early
    hands its bandwidth to the others.
    """
    if len(rnd) == 1:
        flows, factor = rnd[0]
        return flows.solo_time(factor * size_bytes)
    waiting = sorted(range(len(rnd)), key=lambda i: rnd[i][0].latency_s)
    remaining: dict[int, float] = {}
    now = 0.0
    while waiting or remaining:
        active = list(remaining)
        rates = max_min_rates([(rnd[i][0].links, rnd[i][0].counts) for i in active], capacity)
        finishes = [now + remaining[i] / rate for i, rate in zip(active, rates)]
        start = rnd[waiting[0]][0].latency_s if waiting else math.inf
        step_to = min([start, *finishes])
        for i, rate, finish in zip(active, rates, finishes):
            if finish <= step_to:
                del remaining[i]
            else:
                remaining[i] -= rate * (step_to - now)
        now = step_to
        while waiting and rnd[waiting[0]][0].latency_s <= now:
            i = waiting.pop(0)
            remaining[i] = rnd[i][0].per_qp(rnd[i][1] * size_bytes)
    return now
