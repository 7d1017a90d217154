"""All-to-all-v's flows: one flow set per distinct per-peer size, counted per link by class.

An uneven all-to-all (`traces.alltoallv.AllToAllv`) sends `sizes[k]` to member k from every
member (a dispatch) or from member k to every member (a combine). The pairs that carry one
size form a flow set carrying that size, all sets of the exchange in one round: alone on the
network the round takes what max-min sharing of their links gives (`sim.engine.flows`), so a
member that receives (or sends) more keeps its links busy longer and the exchange ends when
its bytes have moved; no link ever carries more than its rate.

Each set is the flows from every chosen sender to every chosen receiver (a != b), counted per
link without routing them one by one by `sim.collectives.alltoall.counted` (its docstring has
the sums), else routed pair by pair.

Every set waits the latency of the exchange's longest route (the grouped sends start together;
the NCCL model replaces it with NCCL's own, `sim.collectives.nccl_p2p`).
tests/sim/collectives/test_alltoallv.py checks the counts against routing pair by pair.

A skewed MoE step lowers thousands of uneven all-to-alls whose size classes are mostly one
member each: the same (senders, receivers) recur across layers and micro-batches, so a
`PairCache` (one per cluster, kept by `sim.collectives.Collectives`) counts each pair of member
lists, and the whole group's flows, once. A flow set is a value: the cached one is equal to
the one counting again would build.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import chain

from sim.collectives.alltoall import (
    MAX_ROUTED_PAIRS,
    all_to_all_flows,
    counted,
    enumerated,
)
from sim.collectives.base import Lowering, hop
from sim.engine.flows import FlowSet
from topology.cluster import Cluster
from traces.alltoallv import AllToAllv
from traces.errors import ConfigError


class PairCache:
    """Flow sets already counted on one cluster (module docstring): the whole group's, by
    group, and `pair_flows`', by (senders, receivers, latency)."""

    def __init__(self) -> None:
        self.whole: dict[tuple[int, ...], FlowSet] = {}
        self.pairs: dict[tuple[tuple[int, ...], tuple[int, ...], float], FlowSet] = {}


def lower_alltoallv(cluster: Cluster, group: Sequence[int], split: AllToAllv,
                    cache: PairCache | None = None) -> Lowering:
    """One round: per distinct per-peer size, the flows that carry it, each carrying its size
    as a fraction of the mean buffer (`split.mean_send_bytes`). `cache`: flow sets counted
    before on this cluster, reused (and new ones added)."""
    group = tuple(group)
    assert split.num_ranks == len(group), "one size per member"
    cache = cache if cache is not None else PairCache()
    whole = cache.whole.get(group)
    if whole is None:
        whole = cache.whole[group] = all_to_all_flows(cluster, group) or \
            enumerated(cluster, group)
    mean = split.mean_send_bytes
    sets = []
    for size, members in split.classes():
        chosen = tuple(group[k] for k in members)
        senders, receivers = (chosen, group) if split.by_sender else (group, chosen)
        key = (senders, receivers, whole.latency_s)
        flows = cache.pairs.get(key)
        if flows is None:
            flows = cache.pairs[key] = pair_flows(cluster, senders, receivers, whole.latency_s)
        sets.append((flows, size / mean))
    return (tuple(sets),)


def pair_flows(cluster: Cluster, senders: Sequence[int], receivers: Sequence[int],
               latency_s: float) -> FlowSet:
    """Every sender sending one flow to every receiver but itself, counted by class where the
    fabric allows (module docstring), else routed pair by pair."""
    counts = counted(cluster, senders, receivers)
    if counts is None:
        counts = routed(cluster, senders, receivers)
    else:
        assert cluster.qps == 1, "counted by class only where routes are not hashed"
    return FlowSet.from_counts(counts, latency_s, cluster.link_capacity, cluster.qps)


def routed(cluster: Cluster, senders: Sequence[int], receivers: Sequence[int]) -> Counter[int]:
    """Flows per link, routed pair by pair (the reference of the counting)."""
    pairs = len(senders) * len(receivers)
    if pairs > MAX_ROUTED_PAIRS:
        raise ConfigError(f"all_to_all: {pairs:,} uneven flows to route one by one, more than "
                          f"the {MAX_ROUTED_PAIRS:,} parasim routes (it counts them by class on "
                          f"a fat tree or rails)")
    routes = [hop(cluster, a, b) for a in senders for b in receivers if a != b]
    return Counter(chain.from_iterable(cluster.spread(routes)))  # each queue pair's route
