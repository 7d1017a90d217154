"""Link ids of a switched cluster by arithmetic, and many hops routed at once with numpy.

`GraphBuilder` numbers links in the order the builders add them (`topology.config`): every
server's NVLink (GPU i to its NVSwitch: 2i, back 2i+1) then PCIe (GPU i to its NIC and back),
server after server; then the fabric: each NIC to its leaf (fat tree) in global NIC order, or
to its rail (rails: rail by rail, server by server); then leaf to spine (two tiers: uplink by
uplink, leaf by leaf) or leaf to pod aggregation (three tiers: pod, uplink, leaf) and
aggregation to core (uplink, core, pod). `LinkIndex` computes those ids from (server, GPU,
NIC, leaf, uplink), so a collective over 131,072 GPUs routes its million hops as a few array
operations instead of a million string-keyed look-ups. `hop_links` is `sim.collectives.base
.hop` for arrays of hops: the same links in the same order (`SwitchedFabric.path`), padded
with -1. It applies to destination-mod-k fat trees and rails (hashed or adaptive uplinks
depend on more than the ends); `LinkIndex.of` checks its formula against the cluster's own
ids at every block's ends, and says None where it does not hold (a cluster built by hand).
tests/topology/test_links.py checks every hop of small clusters against `Cluster.route`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from topology.cluster import Cluster
from topology.fabric import FatTree, Rails
from topology.server import gpu_node, nic_node, nvswitch_node
from topology.variability import Routing

WIDTH = 12
"""Links of the longest route: NVLink there and back (PXN), PCIe, six fabric hops (NIC, leaf,
aggregation, core, aggregation, leaf, NIC), PCIe, NVLink there and back."""


@dataclass(frozen=True, slots=True)
class LinkIndex:
    """The id arithmetic of one switched cluster (see the module)."""

    gpus: int
    nics: int
    servers: int
    nv: int
    """NVLink ids per server (0 for one GPU per server: no NVSwitch)."""
    per_server: int
    fabric_base: int
    """First id of the NIC-to-fabric links."""
    rails: bool
    down: int
    up: int
    leaves: int
    per_pod: int
    pods: int
    cores: int
    """Core switches per uplink plane (`FatTree.cores`)."""
    tiers: int
    tier_base: int
    """First leaf-to-spine (or aggregation) id."""
    core_base: int
    nic_of: np.ndarray
    """NIC index of each local GPU."""
    owner: np.ndarray
    """The first local GPU wired to each NIC (`ServerSpec.owner_of` when the GPU is not); -1
    for a NIC no GPU is wired to (more NICs than GPUs: hops never pin to it)."""

    @staticmethod
    def of(cluster: Cluster) -> LinkIndex | None:
        """The cluster's arithmetic, or None where its ids do not follow it."""
        fabric = cluster.fabric
        if not isinstance(fabric, FatTree | Rails) or not fabric.server.nics:
            return None
        if isinstance(fabric, FatTree) and fabric.spec.routing is not Routing.DMODK:
            return None
        spec = fabric.server
        g, nics, servers = spec.gpus, spec.nics, cluster.num_servers
        if g != cluster.devices_per_server or servers * g != cluster.num_devices:
            return None
        nv = 2 * g if g > 1 else 0
        fabric_base = servers * (nv + 2 * g)
        tier_base = fabric_base + 2 * servers * nics
        tree = fabric if isinstance(fabric, FatTree) else None
        leaves = tree.num_leaves if tree else 0
        up = tree.up if tree else 0
        per_pod = tree.per_pod if tree else 1
        pods = -(-leaves // per_pod) if tree else 0
        index = LinkIndex(
            gpus=g, nics=nics, servers=servers, nv=nv, per_server=nv + 2 * g,
            fabric_base=fabric_base, rails=tree is None, down=tree.down if tree else 0, up=up,
            leaves=leaves, per_pod=per_pod, pods=pods, cores=tree.cores if tree else 0,
            tiers=tree.spec.tiers if tree else 1,
            tier_base=tier_base, core_base=tier_base + 2 * leaves * up,
            nic_of=np.array([spec.nic_of(i) for i in range(g)], dtype=np.int64),
            owner=np.array([next((i for i in range(g) if spec.nic_of(i) == j), -1)
                            for j in range(nics)], dtype=np.int64))
        return index if index._agrees(cluster) else None

    def _agrees(self, cluster: Cluster) -> bool:
        """The formula gives the cluster's own ids at the ends of every block, and its count."""
        last, g, nics = self.servers - 1, self.gpus, self.nics
        checks = [((gpu_node(last, g - 1), f"n{last}.nic{self.nic_of[-1]}"),
                   last * self.per_server + self.nv + 2 * (g - 1))]
        if self.nv:
            checks.append(((gpu_node(last, g - 1), nvswitch_node(last)),
                           last * self.per_server + 2 * (g - 1)))
        upper = f"rail{nics - 1}" if self.rails else f"leaf{(last * nics + nics - 1) // self.down}"
        checks.append(((nic_node(last, nics - 1), upper), self.fabric_base + 2 * (
            (nics - 1) * self.servers + last if self.rails else last * nics + nics - 1)))
        total = self.tier_base
        if not self.rails and self.leaves > 1:
            leaf, u = self.leaves - 1, self.up - 1
            if self.tiers == 2:
                checks.append(((f"leaf{leaf}", f"spine{u}"), self._leaf_up(leaf, u)))
                total = self.core_base
            else:
                checks.append(((f"leaf{leaf}", f"agg{leaf // self.per_pod}.{u}"),
                               self._leaf_up(leaf, u)))
                total = self.core_base
                if self.pods > 1:
                    c, p = self.cores - 1, self.pods - 1
                    checks.append(((f"agg{p}.{u}", f"core{u}.{c}"), self._core_up(u, c, p)))
                    total += 2 * self.up * self.cores * self.pods
        if total != len(cluster.link_capacity):
            return False
        return all(cluster.link_ends[want] == ends for ends, want in checks)

    def _leaf_up(self, leaf: Any, u: Any) -> Any:
        """Id of leaf -> spine (or pod aggregation) `u`; +1 is the way down."""
        if self.tiers == 2:
            return self.tier_base + 2 * (u * self.leaves + leaf)
        pod = leaf // self.per_pod
        size = np.minimum(self.per_pod, self.leaves - pod * self.per_pod)
        return self.tier_base + 2 * (pod * self.up * self.per_pod + u * size
                                     + leaf - pod * self.per_pod)

    def _core_up(self, u: Any, c: Any, pod: Any) -> Any:
        """Id of aggregation (pod, u) -> core (u, c); +1 is the way down."""
        return self.core_base + 2 * ((u * self.cores + c) * self.pods + pod)

    def hop_links(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Links of `hop(cluster, a[k], b[k])` for every k, in route order, one row each,
        padded with -1 (an empty route: a[k] == b[k])."""
        g, ps, nv = self.gpus, self.per_server, self.nv
        sa, ia = np.divmod(a, g)
        sb, ib = np.divmod(b, g)
        out = np.full((len(a), WIDTH), -1, dtype=np.int64)
        same = sa == sb
        moves = same & (ia != ib)
        out[moves, 0] = (sa * ps + 2 * ia)[moves]
        out[moves, 1] = (sb * ps + 2 * ib + 1)[moves]
        cross = ~same
        sa, ia, sb, ib = sa[cross], ia[cross], sb[cross], ib[cross]
        nic = self.nic_of[ib]  # pinned to the receiver's NIC at both ends
        via_a = np.where(self.nic_of[ia] == nic, ia, self.owner[nic])
        via_b = np.where(self.nic_of[ib] == nic, ib, self.owner[nic])
        rows = out[cross]
        pxn = via_a != ia
        rows[pxn, 0] = (sa * ps + 2 * ia)[pxn]
        rows[pxn, 1] = (sa * ps + 2 * via_a + 1)[pxn]
        rows[:, 2] = sa * ps + nv + 2 * via_a
        rows[:, 3:9] = self._fabric(sa, sb, nic)
        rows[:, 9] = sb * ps + nv + 2 * via_b + 1
        pxn = via_b != ib
        rows[pxn, 10] = (sb * ps + 2 * via_b)[pxn]
        rows[pxn, 11] = (sb * ps + 2 * ib + 1)[pxn]
        out[cross] = rows
        return out

    def _fabric(self, sa: np.ndarray, sb: np.ndarray, nic: np.ndarray) -> np.ndarray:
        """The six fabric columns of NIC (sa, nic) to NIC (sb, nic), padded with -1."""
        out = np.full((len(sa), 6), -1, dtype=np.int64)
        base = self.fabric_base
        if self.rails:
            out[:, 0] = base + 2 * (nic * self.servers + sa)
            out[:, 1] = base + 2 * (nic * self.servers + sb) + 1
            return out
        ga, gb = sa * self.nics + nic, sb * self.nics + nic
        la, lb = ga // self.down, gb // self.down
        out[:, 0] = base + 2 * ga
        down = base + 2 * gb + 1
        far = la != lb
        out[~far, 1] = down[~far]
        u, c = gb % self.up, (gb // self.up) % self.cores  # FatTree.core_of
        out[far, 1] = self._leaf_up(la, u)[far]
        if self.tiers == 2:
            out[far, 2] = (self._leaf_up(lb, u) + 1)[far]
            out[far, 3] = down[far]
            return out
        pa, pb = la // self.per_pod, lb // self.per_pod
        pod = far & (pa == pb)
        out[pod, 2] = (self._leaf_up(lb, u) + 1)[pod]
        out[pod, 3] = down[pod]
        core = far & (pa != pb)
        out[core, 2] = self._core_up(u, c, pa)[core]
        out[core, 3] = (self._core_up(u, c, pb) + 1)[core]
        out[core, 4] = (self._leaf_up(lb, u) + 1)[core]
        out[core, 5] = down[core]
        return out


def link_index(cluster: Cluster) -> LinkIndex | None:
    """`LinkIndex.of(cluster)`, computed once per cluster."""
    if "link_index" not in cluster.memo:
        cluster.memo["link_index"] = LinkIndex.of(cluster)
    found = cluster.memo["link_index"]
    assert found is None or isinstance(found, LinkIndex)
    return found


def route_latencies(cluster: Cluster, rows: np.ndarray) -> list[float]:
    """`cluster.path_latency` of every row of `hop_links`: each distinct row of link
    latencies added up by `path_latency` itself (in route order, as Python adds), so the
    figures are the very floats route by route gives."""
    key = "latency_codes"
    if key not in cluster.memo:
        values = sorted(set(cluster.link_latency))
        codes = np.searchsorted(np.asarray(values, dtype=float),
                                np.asarray(cluster.link_latency, dtype=float))
        cluster.memo[key] = (values, np.append(codes, len(values)).astype(np.int64))
    values, codes = cluster.memo[key]  # type: ignore[misc]
    base = len(values) + 1  # the last code: no link (padding)
    if base ** WIDTH >= 1 << 62:
        return [cluster.path_latency(tuple(int(x) for x in row if x >= 0)) for row in rows]
    packed = np.zeros(len(rows), dtype=np.int64)
    for col in range(WIDTH):
        packed = packed * base + codes[rows[:, col]]
    distinct, inverse = np.unique(packed, return_inverse=True)
    sums = []
    for word in distinct.tolist():
        digits = []
        for _ in range(WIDTH):
            word, digit = divmod(word, base)
            digits.append(digit)
        sums.append(sum(values[d] for d in reversed(digits) if d < len(values)))
    return np.asarray(sums, dtype=float)[inverse].tolist()


def link_counts(ids: np.ndarray, weights: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """The distinct link ids (sorted; -1, no link, left out) among `ids` (the rows of
    `hop_links`, or ids with their `weights`) and the flows on each: by sorting, in
    proportion to the hops, not to the cluster."""
    flat, order = ids.ravel(), None
    keep = flat >= 0
    flat = flat[keep]
    if weights is None:
        flat = np.sort(flat)
    else:
        order = np.argsort(flat, kind="stable")
        flat = flat[order]
    if not len(flat):
        return flat, np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate(([True], flat[1:] != flat[:-1])))
    if weights is None:
        counts = np.diff(np.append(starts, len(flat)))
    else:
        counts = np.add.reduceat(weights.ravel()[keep][order], starts)
    return flat[starts], counts.astype(np.int64)
