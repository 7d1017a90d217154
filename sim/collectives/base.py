"""What a collective algorithm produces: rounds of flow sets, with bytes as a fraction of S.

A `Lowering` (defined in `sim.engine.flows`) is a tuple of communication rounds run one after
another
(lock-step: the next round starts when every flow set of the previous one is done). Each `Round`
is a tuple of `(FlowSet, factor)`: every flow of the set carries `factor * size_bytes`.
Lowerings depend on the group and the cluster but not on the size, so they are cached and
reused for every size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from enum import StrEnum
from itertools import chain

import numpy as np

from sim.engine.flows import FlowSet
from sim.engine.flows import Lowering as Lowering  # re-exported for the algorithm modules
from sim.engine.flows import Round as Round
from topology.cluster import Cluster
from topology.links import link_counts, link_index, route_latencies
from traces.ops import OpKind


class Algorithm(StrEnum):
    """The collective algorithms a user can name (`--algo`, `[sim] algo`); `AUTO` picks one
    (`sim.collectives.Collectives.resolve`). The order after `AUTO` is the tie-break of
    `AUTO`: the first of equally fast algorithms wins."""

    AUTO = "auto"
    RING = "ring"
    TREE = "tree"
    HIERARCHICAL = "hierarchical"
    RHD = "rhd"
    TORUS = "torus"
    DIRECT = "direct"
    GLOO = "gloo"
    """Only where ranks talk gloo (localhost); `AUTO` takes it there."""
    RING_FLOWS = "ring_flows"
    """parasim's own flow-level ring at the links' full rate, without NCCL's protocol and
    channel ceilings. Where NCCL runs, `ring` is NCCL's ring (named `ring/<protocol>`, as
    `auto` names it, so one label never gives two times); elsewhere the two are one."""
    TREE_FLOWS = "tree_flows"
    """The same for `tree`: parasim's flow-level double binary tree."""


NCCL_NAMED = {Algorithm.RING: "ring", Algorithm.TREE: "tree"}
"""Algorithms a user names that, where NCCL runs, are NCCL's (`sim.collectives.protocols.Algo`
values); the `_FLOWS` ones are parasim's flows of the same shape."""
FLOWS_OF = {Algorithm.RING_FLOWS: Algorithm.RING, Algorithm.TREE_FLOWS: Algorithm.TREE}


AR, RS, AG, BCAST, A2A = (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER,
                          OpKind.BROADCAST, OpKind.ALL_TO_ALL)


def flowset(cluster: Cluster, routes: Sequence[tuple[int, ...]], latency_s: float) -> FlowSet:
    """Routes on `cluster` (of `hop`) aggregated into one lock-step flow set, each route's
    connection spread over its queue pairs (`Cluster.spread`)."""
    return FlowSet.of(cluster.spread(routes), latency_s, cluster.link_capacity, cluster.qps)


def by_server(cluster: Cluster, group: Sequence[int]) -> list[list[int]]:
    """Members grouped by server: servers in order of first appearance, members in group order."""
    servers: dict[int, list[int]] = {}
    for rank in group:
        servers.setdefault(cluster.server_of(rank), []).append(rank)
    return list(servers.values())


def uniform(servers: list[list[int]]) -> bool:
    return len({len(s) for s in servers}) == 1


def nic_pin(cluster: Cluster, device: int) -> int | None:
    """The NIC index nearest `device` (None on fabrics without NICs)."""
    server = getattr(cluster.fabric, "server", None)
    if server is None or not server.nics:
        return None
    return server.nic_of(device % server.gpus)


def default_channels(cluster: Cluster, servers: list[list[int]]) -> int:
    """Like NCCL across nodes: one ring per NIC the members can drive; one inside a server."""
    server = getattr(cluster.fabric, "server", None)
    if len(servers) == 1 or server is None or not server.nics or not uniform(servers):
        return 1
    return min(len(servers[0]), server.nics)


def hop(cluster: Cluster, a: int, b: int) -> tuple[int, ...]:
    """Route of one hop; across servers pinned to the receiver's NIC so rails stay aligned."""
    nic = nic_pin(cluster, b) if cluster.server_of(a) != cluster.server_of(b) else None
    return cluster.route(a, b, nic)


Hops = tuple[Sequence[int] | np.ndarray, Sequence[int] | np.ndarray, int]
"""Hops `hop(cluster, a[k], b[k])` for every k, each `times` over: (a, b, times)."""


def hops_flowset(cluster: Cluster, parts: Sequence[Hops],
                 latency: Callable[[list[list[float]]], float]) -> FlowSet:
    """The flow set of every part's hops (each flow `times` over), its latency `latency` of
    each part's route latencies (`cluster.path_latency`, in hop order): by link arithmetic
    where the fabric allows (`topology.links`: the same integers and floats), else hop by
    hop."""
    index = link_index(cluster)
    capacity = cluster.link_capacity
    if index is None:
        counts: Counter[int] = Counter()
        lats = []
        for a, b, times in parts:
            routes = [hop(cluster, int(x), int(y)) for x, y in zip(a, b, strict=True)]
            spread = cluster.spread(routes)
            for _ in range(times):
                counts.update(chain.from_iterable(spread))
            lats.append([cluster.path_latency(r) for r in routes])
        return FlowSet.from_counts(counts, latency(lats), capacity, cluster.qps)
    ids, weights, lats = [], [], []
    for a, b, times in parts:
        rows = index.hop_links(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
        used, flows = link_counts(rows)
        ids.append(used)
        weights.append(flows * times)
        lats.append(route_latencies(cluster, rows))
    used, flows = link_counts(np.concatenate(ids), np.concatenate(weights))
    if "capacity" not in cluster.memo:
        cluster.memo["capacity"] = np.asarray(capacity, dtype=float)
    array = cluster.memo["capacity"]
    assert isinstance(array, np.ndarray)
    return FlowSet.from_arrays(used, flows, latency(lats), array)


def rotated(servers: list[list[int]], channel: int) -> list[list[int]]:
    """Each server's members rotated by `channel`: channel c enters every server at member c."""
    return [s[channel % len(s):] + s[: channel % len(s)] for s in servers]


def cycle_latency(cluster: Cluster, routes: Sequence[tuple[int, ...]]) -> float:
    """Latency for a chunk to travel n-1 hops of a ring: the whole cycle minus its fastest hop."""
    lats = [cluster.path_latency(r) for r in routes]
    return sum(lats) - min(lats)


def busbw_factor(kind: OpKind, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor."""
    if kind is AR:
        return 2 * (n - 1) / n
    if kind in (RS, AG, A2A):
        return (n - 1) / n
    return 1.0
