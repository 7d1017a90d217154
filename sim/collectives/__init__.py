"""Collective algorithms lowered to rounds of flow sets, timed by the flow model or analytically.

`Collectives(cluster)` caches lowerings per (op, group, algorithm, channels) and picks the
algorithm. `auto` on an NVSwitch/InfiniBand GPU cluster picks what NCCL would
(`sim.collectives.nccl`: the lowest predicted time among its algorithms and protocols) and
returns the flows of that algorithm carrying the protocol's latency and wire bytes
(`sim.collectives.nccl_plan`), named like NCCL's debug output, e.g. `ring/LL128`; elsewhere
(a torus) `auto` is what gloo runs where ranks
talk gloo (`sim.collectives.gloo`: localhost), else the fastest applicable
algorithm by `analytic_time`, the alpha-beta time of the lowering alone on the network
(`sim.engine.flows.solo_time`). Every algorithm stays available by name (`Algorithm`, parsed from a
flag by `parse_algorithm`), without a protocol, except `ring` and `tree` where NCCL runs: those
are NCCL's (its best protocol for that algorithm, named `ring/Simple` as `auto` names it, so one
label never gives two times); parasim's own flow-level ring and tree at the links' full rate stay
reachable as `ring_flows` and `tree_flows`. All-to-all, which NCCL runs as grouped sends
and receives per peer, is NCCL's `p2p/LL` or `p2p/Simple` there (`sim.collectives.nccl_p2p`:
the direct flows with NCCL's per-peer latency and protocol), `direct` elsewhere; an uneven one
(`split`, `traces.alltoallv`) moves its per-peer sizes (`sim.collectives.alltoallv`), a DeepEP
one (`split.deepep`) its node-deduplicated flows (`sim.collectives.deepep`). The flow
path is `sim.engine.network.Network.run`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.collectives.alltoallv import PairCache, lower_alltoallv
from sim.collectives.base import (
    A2A,
    FLOWS_OF,
    NCCL_NAMED,
    Algorithm,
    Lowering,
    busbw_factor,
    by_server,
    default_channels,
)
from sim.collectives.deepep import NAME as DEEPEP
from sim.collectives.deepep import lower_deepep
from sim.collectives.direct import EXCHANGE, lower_direct, lower_exchange, lower_p2p
from sim.collectives.gloo import lower_gloo
from sim.collectives.hierarchical import lower_hierarchical
from sim.collectives.nccl import NCCL_KINDS, choose
from sim.collectives.nccl_p2p import P2P, p2p_lowering
from sim.collectives.nccl_plan import plan, with_protocol
from sim.collectives.nccl_system import NcclSystem, system_for
from sim.collectives.nvls import lower_nvls
from sim.collectives.protocols import Algo
from sim.collectives.rhd import lower_rhd
from sim.collectives.ring import lower_ring
from sim.collectives.size import check_lowering_size
from sim.collectives.torus import lower_torus
from sim.collectives.tree import lower_tree
from sim.engine.flows import solo_time
from topology.cluster import Cluster
from traces.alltoallv import AllToAllv
from traces.errors import ConfigError, show
from traces.ops import OpKind

Lower = Callable[[Cluster, OpKind, Sequence[int], int | None], Lowering | None]

# Order is the tie-break of `auto` (`Algorithm`'s): the first of equally fast algorithms wins.
ALGORITHMS: dict[Algorithm, Lower] = {
    Algorithm.RING: lower_ring,
    Algorithm.TREE: lower_tree,
    Algorithm.HIERARCHICAL: lower_hierarchical,
    Algorithm.RHD: lower_rhd,
    Algorithm.TORUS: lower_torus,
    Algorithm.DIRECT: lower_direct,
    Algorithm.GLOO: lower_gloo,  # only where ranks talk gloo (localhost); `auto` takes it there
    Algorithm.RING_FLOWS: lower_ring,  # `ring` where NCCL runs is NCCL's; these stay parasim's
    Algorithm.TREE_FLOWS: lower_tree,
}
CHOICES = tuple(a for a in ALGORITHMS if a not in FLOWS_OF)
"""What `auto` chooses among off NCCL (the _FLOWS names are the same lowerings again)."""
assert tuple(ALGORITHMS) == tuple(Algorithm)[1:], "one lowering per algorithm, in its order"

# The flows each of NCCL's algorithms moves, by parasim's lowerings (NVLS trees and CollNet,
# whose in-network steps parasim does not model, move a tree's flows). A lowering named after
# an NCCL choice ("ring/LL128") has the structure of its algorithm's flows.
STRUCTURE: dict[Algo, str] = {Algo.RING: "ring", Algo.TREE: "tree", Algo.NVLS: "nvls",
                              Algo.NVLS_TREE: "tree", Algo.COLLNET_DIRECT: "tree",
                              Algo.COLLNET_CHAIN: "tree"}
_STRUCTURES: dict[str, Lower] = {**{str(a): lower for a, lower in ALGORITHMS.items()},
                                 "nvls": lower_nvls}

__all__ = ["ALGORITHMS", "ALGORITHM_NAMES", "Algorithm", "Collectives", "Lowering", "analytic_time",
           "busbw_factor", "parse_algorithm"]


def parse_algorithm(text: str, flag: str = "--algo") -> Algorithm:
    """The algorithm a flag names, or a ConfigError that lists them."""
    if text not in ALGORITHM_NAMES:
        raise ConfigError(f"{flag}: {show(text)} is not an algorithm "
                          f"(known: {', '.join(ALGORITHM_NAMES)})")
    return Algorithm(text)


ALGORITHM_NAMES = tuple(map(str, Algorithm))
"""`Algorithm`'s names as plain strings (`traces.fields.check_choice` compares types)."""

_Key = tuple[OpKind, tuple[int, ...], str, int | None, AllToAllv | None]


class Collectives:
    """Lowerings of one cluster, cached; algorithm choice by analytic time."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._lowerings: dict[_Key, Lowering | None] = {}
        self._choice: dict[tuple[OpKind, tuple[int, ...], float, int | None,
                                 AllToAllv | None], str] = {}
        self._nccl: dict[tuple[OpKind, tuple[int, ...], float, int | None, Algo | None,
                               AllToAllv | None], tuple[str, Lowering] | None] = {}
        self._systems: dict[tuple[int, ...], NcclSystem | None] = {}
        self._pairs = PairCache()  # all-to-all-v flow sets counted once (`lower_alltoallv`)

    def lowering(self, kind: OpKind, group: Sequence[int], algo: str,
                 channels: int | None = None, split: AllToAllv | None = None
                 ) -> Lowering | None:
        """The algorithm's rounds for this group, or None where it does not apply. A name
        from NCCL's choice ("ring/LL128", "p2p/Simple") gives its algorithm's flows, without
        the protocol (what a folded copy of the group adds to the links). An uneven
        all-to-all (`split`) runs only as direct flows (NCCL's p2p moves the same)."""
        key: _Key = (kind, tuple(group), algo, channels, split)
        if key not in self._lowerings:
            check_lowering_size(len(group), channels or self._channels(group))
            direct = algo == Algorithm.DIRECT or algo.startswith(f"{P2P}/")
            lowering: Lowering | None
            if algo == EXCHANGE:  # a ring-exchange step of tp_comm_overlap, not NCCL's
                lowering = lower_exchange(self.cluster, tuple(group))
            elif split is not None and split.deepep is not None:
                lowering = lower_deepep(self.cluster, tuple(group), split)
            elif split is not None:
                lowering = lower_alltoallv(self.cluster, tuple(group), split, self._pairs) \
                    if direct and kind is A2A and len(group) > 1 else None
            elif algo.startswith(f"{P2P}/"):
                lowering = self.lowering(kind, group, Algorithm.DIRECT, channels)
            elif "/" in algo:
                lowering = self._structure(kind, group, Algo(algo.split("/")[0]), channels)
            else:
                lowering = ALGORITHMS[Algorithm(algo)](self.cluster, kind, tuple(group), channels)
            self._lowerings[key] = lowering
        return self._lowerings[key]

    def _structure(self, kind: OpKind, group: Sequence[int], algo: Algo,
                   channels: int | None) -> Lowering | None:
        """The flows of one of NCCL's algorithms: its parasim lowering, else a ring's."""
        name = STRUCTURE[algo]
        lowering = self.lowering(kind, group, name, channels) if name in ALGORITHMS else \
            _STRUCTURES[name](self.cluster, kind, tuple(group), channels)
        return lowering if lowering is not None else self.lowering(kind, group, "ring", channels)

    def _channels(self, group: Sequence[int]) -> int:
        """The most channels a lowering of `group` runs: NCCL's, or one ring per NIC."""
        system = self.nccl_system(group) if len(group) > 1 else None
        return max(system.comm_channels if system else 1,
                   default_channels(self.cluster, by_server(self.cluster, group)))

    def nccl_system(self, group: Sequence[int]) -> NcclSystem | None:
        """NCCL's view of `group`, or None where NCCL does not run (no NVSwitch/NIC server,
        an accelerator without an NCCL model, uneven ranks per node)."""
        key = tuple(group)
        if key not in self._systems:
            try:
                self._systems[key] = system_for(self.cluster, key) if len(key) > 1 else None
            except ConfigError:
                self._systems[key] = None
        return self._systems[key]

    def nccl(self, kind: OpKind, group: Sequence[int], size_bytes: float,
             channels: int | None = None, algo: Algo | None = None,
             split: AllToAllv | None = None) -> tuple[str, Lowering] | None:
        """NCCL's choice for this collective ("ring/LL128"), among `algo`'s protocols when
        given (like NCCL_ALGO), and its lowering: the algorithm's flows carrying the
        protocol's latency and wire bytes; an all-to-all is NCCL's grouped sends
        ("p2p/Simple", `sim.collectives.nccl_p2p`); None where NCCL has none."""
        key = (kind, tuple(group), size_bytes, channels, algo, split)
        if key not in self._nccl:
            sys = self.nccl_system(group)
            found = None
            only = (algo,) if algo is not None else None
            if sys is not None and kind is A2A and algo is None and size_bytes > 0:
                flows = self.lowering(kind, group, Algorithm.DIRECT, None, split)
                assert flows is not None, "direct flows run every all-to-all"
                found = p2p_lowering(sys, flows, size_bytes, split)
            elif sys is not None and kind in NCCL_KINDS and size_bytes > 0 \
                    and choose(sys, kind, size_bytes, only) is not None:
                p = plan(sys, kind, size_bytes, algo=algo)
                base = self._structure(kind, group, p.algorithm, channels)
                assert base is not None, f"no ring for {kind} on {len(group)} ranks"
                found = (f"{p.algorithm}/{p.protocol}",
                         with_protocol(base, p, self.cluster.link_capacity))
            self._nccl[key] = found
        return self._nccl[key]

    def p2p(self, src: int, dst: int) -> Lowering:
        """One send from `src` to `dst`."""
        key: _Key = (OpKind.SEND, (src, dst), "p2p", None, None)
        lowering = self._lowerings.get(key)
        if lowering is None:
            lowering = self._lowerings[key] = lower_p2p(self.cluster, src, dst)
        return lowering

    def applicable(self, kind: OpKind, group: Sequence[int]) -> list[Algorithm]:
        return [a for a in CHOICES if self.lowering(kind, group, a) is not None]

    def resolve(self, kind: OpKind, group: Sequence[int], size_bytes: float,
                algo: Algorithm = Algorithm.AUTO, channels: int | None = None,
                split: AllToAllv | None = None) -> tuple[str, Lowering]:
        """The algorithm to use (its name, or NCCL's choice: "ring/LL128") and its lowering:
        `auto` is NCCL's choice where NCCL runs, else the fastest applicable algorithm by
        analytic time. `split`: an all-to-all's uneven per-peer sizes."""
        if split is not None and split.deepep is not None:  # DeepEP's kernels, not NCCL
            deepep = self.lowering(kind, group, DEEPEP, channels, split)
            assert deepep is not None
            return DEEPEP, deepep
        if algo == Algorithm.AUTO:
            chosen = self.nccl(kind, group, size_bytes, channels, split=split)
            if chosen is not None:
                return chosen
            gloo = self.lowering(kind, group, Algorithm.GLOO, channels)
            if gloo is not None:  # what gloo runs, whatever is fastest (sim.collectives.gloo)
                return str(Algorithm.GLOO), gloo
        if algo in NCCL_NAMED:  # NCCL's ring (tree) where NCCL runs, as `auto` names it
            chosen = self.nccl(kind, group, size_bytes, channels, Algo(NCCL_NAMED[algo]))
            if chosen is not None:
                return chosen
        if algo != Algorithm.AUTO:
            if algo not in ALGORITHMS:
                raise ConfigError(f"--algo: {algo!r} is not an algorithm "
                                  f"(known: auto, {', '.join(ALGORITHMS)})")
            lowering = self.lowering(kind, group, algo, channels, split)
            if lowering is None:
                raise ConfigError(f"--algo: {algo} cannot run {kind} on this group of "
                                  f"{len(group)} (try: {', '.join(self.applicable(kind, group))})")
            return str(algo), lowering
        key = (kind, tuple(group), size_bytes, channels, split)
        if key not in self._choice:
            options = {a: low for a in CHOICES
                       if (low := self.lowering(kind, group, a, channels, split)) is not None}
            if not options:
                raise ConfigError(f"no algorithm can run {kind} on a group of {len(group)}")
            times = [analytic_time(self.cluster, low, size_bytes) for low in options.values()]
            self._choice[key] = str(list(options)[times.index(min(times))])
        best = self._choice[key]
        lowering = self.lowering(kind, group, best, channels, split)
        assert lowering is not None
        return best, lowering


def analytic_time(cluster: Cluster, lowering: Lowering, size_bytes: float) -> float:
    """Alpha-beta time with nothing else on the network (`sim.engine.flows.solo_time`)."""
    return solo_time(lowering, size_bytes, cluster.link_capacity)
