"""Collective algorithms lowered to rounds of flow sets, timed by the flow model or analytically.

`Collectives(cluster)` caches lowerings per (op, group, algorithm, channels) and picks the
algorithm (`auto`: the fastest by `analytic_time`, the alpha-beta time of the lowering alone on
the network, `sim.flows.solo_time`). The flow path is `sim.network.Network.run`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.collectives.base import Lowering, busbw_factor
from sim.collectives.direct import lower_direct, lower_p2p
from sim.collectives.hierarchical import lower_hierarchical
from sim.collectives.rhd import lower_rhd
from sim.collectives.ring import lower_ring
from sim.collectives.torus import lower_torus
from sim.collectives.tree import lower_tree
from sim.flows import solo_time
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

__all__ = ["ALGORITHMS", "Collectives", "Lowering", "analytic_time", "busbw_factor"]

_Key = tuple[OpKind, tuple[int, ...], str, int | None]


class Collectives:
    """Lowerings of one cluster, cached; algorithm choice by analytic time."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._lowerings: dict[_Key, Lowering | None] = {}
        self._choice: dict[tuple[OpKind, tuple[int, ...], float, int | None], str] = {}

    def lowering(self, kind: OpKind, group: Sequence[int], algo: str,
                 channels: int | None = None) -> Lowering | None:
        """The algorithm's rounds for this group, or None where it does not apply."""
        key: _Key = (kind, tuple(group), algo, channels)
        if key not in self._lowerings:
            self._lowerings[key] = ALGORITHMS[algo](self.cluster, kind, tuple(group), channels)
        return self._lowerings[key]

    def p2p(self, src: int, dst: int) -> Lowering:
        """One send from `src` to `dst`."""
        key: _Key = (OpKind.SEND, (src, dst), "p2p", None)
        lowering = self._lowerings.get(key)
        if lowering is None:
            lowering = self._lowerings[key] = lower_p2p(self.cluster, src, dst)
        return lowering

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
            options = {a: low for a in ALGORITHMS
                       if (low := self.lowering(kind, group, a, channels)) is not None}
            if not options:
                raise ConfigError(f"no algorithm can run {kind} on a group of {len(group)}")
            times = [analytic_time(self.cluster, low, size_bytes) for low in options.values()]
            self._choice[key] = list(options)[times.index(min(times))]
        best = self._choice[key]
        lowering = self.lowering(kind, group, best, channels)
        assert lowering is not None
        return best, lowering


def analytic_time(cluster: Cluster, lowering: Lowering, size_bytes: float) -> float:
    """Alpha-beta time with nothing else on the network (`sim.flows.solo_time`)."""
    return solo_time(lowering, size_bytes, cluster.link_capacity)
