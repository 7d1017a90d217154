"""Collective algorithms lowered to flow sets, timed by the flow model or analytically.

`Collectives(cluster)` caches lowerings per (op, group, algorithm, channels). `analytic_time`
is the alpha-beta path: per phase, the slowest flow set's latency plus its bytes over its
max-min share when nothing else is on the network. `run` is the flow path: a simpy process
that starts each phase's flow sets on a shared `Network` and waits for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

import simpy

from sim.collectives.base import Lowering, Phase, busbw_factor
from sim.collectives.direct import lower_direct, lower_p2p
from sim.collectives.hierarchical import lower_hierarchical
from sim.collectives.rhd import lower_rhd
from sim.collectives.ring import lower_ring
from sim.collectives.torus import lower_torus
from sim.collectives.tree import lower_tree
from sim.maxmin import max_min_rates
from sim.network import Network
from topology.cluster import Cluster
from traces.errors import ConfigError
from traces.ops import OpKind

Lower = Callable[[Cluster, OpKind, Sequence[int], int | None], Lowering | None]

# Order is the tie-break of `auto`: the first of equally fast algorithms wins.
ALGORITHMS: dict[str, Lower] = {
    "ring": lower_ring,
    "tree": lower_tree,
    "hierarchical": lower_hierarchical,
    "rhd": lower_rhd,
    "torus": lower_torus,
    "direct": lower_direct,
}

__all__ = ["ALGORITHMS", "Collectives", "Lowering", "analytic_time", "busbw_factor", "run"]


class Collectives:
    """Lowerings of one cluster, cached; algorithm choice by analytic time."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._lowerings: dict[tuple, Lowering | None] = {}
        self._choice: dict[tuple, str] = {}

    def lowering(self, kind: OpKind, group: Sequence[int], algo: str,
                 channels: int | None = None) -> Lowering | None:
        """The algorithm's phases for this group, or None where it does not apply."""
        key = (kind, tuple(group), algo, channels)
        if key not in self._lowerings:
            self._lowerings[key] = ALGORITHMS[algo](self.cluster, kind, tuple(group), channels)
        return self._lowerings[key]

    def p2p(self, src: int, dst: int) -> Lowering:
        key = (OpKind.SEND, (src, dst), "p2p", None)
        if key not in self._lowerings:
            self._lowerings[key] = lower_p2p(self.cluster, src, dst)
        return self._lowerings[key]  # type: ignore[return-value]

    def applicable(self, kind: OpKind, group: Sequence[int]) -> list[str]:
        return [a for a in ALGORITHMS if self.lowering(kind, group, a) is not None]

    def resolve(self, kind: OpKind, group: Sequence[int], size_bytes: float, algo: str = "auto",
                channels: int | None = None) -> tuple[str, Lowering]:
        """The algorithm to use (`auto` picks the fastest analytically) and its lowering."""
        if algo != "auto":
            if algo not in ALGORITHMS:
                raise ConfigError(f"--algo: {algo!r} is not an algorithm "
                                  f"(known: auto, {', '.join(ALGORITHMS)})")
            lowering = self.lowering(kind, group, algo, channels)
            if lowering is None:
                raise ConfigError(f"--algo: {algo} cannot run {kind} on this group of "
                                  f"{len(group)} (try: {', '.join(self.applicable(kind, group))})")
            return algo, lowering
        key = (kind, tuple(group), size_bytes, channels)
        if key not in self._choice:
            options = self.applicable(kind, group)
            if not options:
                raise ConfigError(f"no algorithm can run {kind} on a group of {len(group)}")
            lowerings = [self.lowering(kind, group, a, channels) for a in options]
            times = [analytic_time(self.cluster, low, size_bytes) for low in lowerings]
            self._choice[key] = options[times.index(min(times))]
        best = self._choice[key]
        return best, self.lowering(kind, group, best, channels)  # type: ignore[return-value]


def analytic_time(cluster: Cluster, lowering: Lowering, size_bytes: float) -> float:
    """Alpha-beta time with nothing else on the network: the phases' times added up."""
    return sum(_phase_time(cluster.link_capacity, phase, size_bytes) for phase in lowering)


def _phase_time(capacity: Sequence[float], phase: Phase, size_bytes: float) -> float:
    """A phase alone: each flow set waits its latency, then shares links max-min fairly.

    One flow set takes latency + bytes / its bottleneck share. Several (the channels of a
    ring, the chunks of a torus phase) are stepped from one start or finish to the next, so a
    set that starts early or ends early hands its bandwidth to the others.
    """
    if len(phase) == 1:
        flows, factor = phase[0]
        return flows.latency_s + factor * size_bytes / flows.solo_rate
    waiting = sorted(range(len(phase)), key=lambda i: phase[i][0].latency_s)
    remaining: dict[int, float] = {}
    now = 0.0
    while waiting or remaining:
        active = list(remaining)
        rates = max_min_rates([(phase[i][0].links, phase[i][0].counts) for i in active], capacity)
        finishes = [now + remaining[i] / rate for i, rate in zip(active, rates)]
        start = phase[waiting[0]][0].latency_s if waiting else float("inf")
        step_to = min([start, *finishes])
        for i, rate, finish in zip(active, rates, finishes):
            if finish <= step_to:
                del remaining[i]
            else:
                remaining[i] -= rate * (step_to - now)
        now = step_to
        while waiting and phase[waiting[0]][0].latency_s <= now:
            i = waiting.pop(0)
            remaining[i] = phase[i][1] * size_bytes
    return now


def run(env: simpy.Environment, network: Network, lowering: Lowering,
        size_bytes: float) -> Generator[simpy.Event, None, None]:
    """simpy process: the phases one after another, each phase's flow sets together."""
    yield network.run(lowering, size_bytes)
