"""All-to-all's flows counted per link by class, without routing its n·(n−1) flows one by one.

`lower_direct` (`sim.collectives.direct`) routes every pair (`hop`: across servers on the
receiver's NIC index at both ends, a PXN hop over NVLink first where the sender's own NIC is
another) and counts the flows per link: n² routes, 67 M at 8192 GPUs. On a switched fabric
(`topology.fabric`: a two- or three-tier fat tree, rails) the routes have a structure that
gives every link's count in closed form from a few sums over the members:

  - inside a server: each member sends to the m−1 others over its NVLink, and receives as much;
  - a sender's hop to the NIC of index j (and its PXN hop to that NIC's GPU): the members of
    other servers on NIC j, D_j − d_j (D_j in the group, d_j per server);
  - NIC (s, j) into the fabric: m · (D_j − d_j); out of the fabric to it: d_j · (n − m);
  - fat tree, leaf l up to its spine (or pod aggregation) u: S_l · (U_u − U_u,l), where S_l
    counts the members under leaf l and U_u,l the receivers under it whose NIC's global index
    is ≡ u (destination-mod-k up-routing, `FatTree.nic_path`); down: U_u,l · (n − S_l);
  - three tiers, pod aggregation u to core (u, c) and back: the same with pods for leaves,
    receivers grouped by (u, c).

So its cost grows with the links, not the pairs. It applies to destination-mod-k routing
(not to hashed or adaptive uplinks: a fabric whose `symmetric` is false) and to groups that
hold the same local GPUs in every server they touch (what an expert- or data-parallel group
over whole nodes does); others are routed pair by pair. The result is the very `FlowSet`
pair-by-pair routing builds: the same integer counts, and the latency of the longest route,
found among one server pair per relation (the same server, leaf, pod, or none) whose routes
have every shape the group's routes have (links of one kind share one latency:
`topology.override` sets them per kind). tests/sim/collectives/test_alltoall.py checks
equality against pair-by-pair routing.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.collectives.base import flowset, hop
from sim.engine.flows import FlowSet
from topology.cluster import Cluster
from topology.fabric import FatTree, Rails
from topology.server import ServerSpec, gpu_node, nic_node, nvswitch_node
from traces.errors import ConfigError

AGGREGATE_FROM = 2
"""Groups of at least this many ranks are counted by class (every size: the result is the
same `FlowSet`)."""

MAX_ROUTED_PAIRS = 1 << 20
"""The most flows routed one by one (1,025 ranks; ~12 us a route here, so ~13 s): above it,
a group that cannot be counted by class is refused before its routes are built."""


def all_to_all_flows(cluster: Cluster, group: Sequence[int]) -> FlowSet | None:
    """The flow set of every member sending to every other at once, counted by class; None
    where the fabric or the group has no such structure (route pair by pair then)."""
    fabric = cluster.fabric
    if not isinstance(fabric, FatTree | Rails) or len(group) < AGGREGATE_FROM:
        return None
    if not getattr(fabric, "symmetric", True):  # hashed or adaptive uplinks: no closed form
        return None
    spec = fabric.server
    if spec.gpus != cluster.devices_per_server or spec.nics == 0:
        return None
    servers: dict[int, list[int]] = {}
    for rank in group:
        s, i = divmod(rank, spec.gpus)
        servers.setdefault(s, []).append(i)
    local = sorted(next(iter(servers.values())))
    if any(sorted(v) != local for v in servers.values()) or len(set(group)) != len(group):
        return None
    counts = LinkCounts(cluster)
    n, m = len(group), len(local)
    per_nic: dict[int, int] = {}  # receivers per server on NIC j
    for i in local:
        per_nic[spec.nic_of(i)] = per_nic.get(spec.nic_of(i), 0) + 1
    many = len(servers) > 1
    for s in servers:
        _in_server(counts, s, local, many, per_nic, n, len(servers), spec)
    if many:
        if isinstance(fabric, FatTree):
            _fat_tree(counts, fabric, list(servers), m, per_nic, n)
        else:
            for s in servers:
                for j, d in per_nic.items():
                    counts.add(nic_node(s, j), f"rail{j}", m * (d * len(servers) - d))
                    counts.add(f"rail{j}", nic_node(s, j), d * (n - m))
    latency = max(cluster.path_latency(route) for route in _representatives(cluster, servers))
    return FlowSet.from_counts(counts.by_link, latency, cluster.link_capacity)


class LinkCounts:
    """Flows per link id, added by the link's end nodes."""

    def __init__(self, cluster: Cluster) -> None:
        self.link = cluster.link
        self.by_link: dict[int, int] = {}

    def add(self, u: str, v: str, flows: int) -> None:
        if flows:
            link = self.link(u, v)
            self.by_link[link] = self.by_link.get(link, 0) + flows


def _in_server(counts: LinkCounts, s: int, local: list[int], many: bool, per_nic: dict[int, int],
               n: int, num_servers: int, spec: ServerSpec) -> None:
    """Server s's links: NVLink among its members and the PXN hops, PCIe to and from its
    NICs, and its NICs' links into and out of the fabric (rails: added by the caller)."""
    m = len(local)
    switch = nvswitch_node(s)
    if m > 1:
        for i in local:
            counts.add(gpu_node(s, i), switch, m - 1)
            counts.add(switch, gpu_node(s, i), m - 1)
    if not many:
        return
    nic_of, owner_of = spec.nic_of, spec.owner_of
    for i in local:
        for j, d in per_nic.items():
            out = d * num_servers - d  # receivers on NIC j in other servers
            via = owner_of(j, prefer=i)
            if via != i:
                counts.add(gpu_node(s, i), switch, out)
                counts.add(switch, gpu_node(s, via), out)
            counts.add(gpu_node(s, via), nic_node(s, j), out)
        counts.add(nic_node(s, nic_of(i)), gpu_node(s, i), n - m)


def _fat_tree(counts: LinkCounts, tree: FatTree, servers: list[int], m: int,
              per_nic: dict[int, int], n: int) -> None:
    """The fat tree's links: NIC to leaf and back, leaf to spine (or pod aggregation) and
    back, and with three tiers aggregation to core and back (see the module)."""
    nics, up, per_pod = tree.server.nics, tree.up, tree.per_pod
    three = tree.spec.tiers != 2
    senders: dict[int, int] = {}  # S_l: members under leaf l
    below: dict[tuple[int, int], int] = {}  # U_{u,l}: receivers under leaf l on uplink u
    cores: dict[tuple[int, int, int], int] = {}  # receivers in pod p on core (u, c)
    total = len(servers) * m
    for s in servers:
        leaf = tree._leaf(s * nics)
        senders[leaf] = senders.get(leaf, 0) + m
        for j, d in per_nic.items():
            leaf_name, nic = tree._leaf_name(leaf), nic_node(s, j)
            counts.add(nic, leaf_name, m * (d * len(servers) - d))
            counts.add(leaf_name, nic, d * (n - m))
            g = s * nics + j
            u = g % up
            below[(u, leaf)] = below.get((u, leaf), 0) + d
            if three:
                key = (u, (g // up) % per_pod, leaf // per_pod)
                cores[key] = cores.get(key, 0) + d
    by_uplink: dict[int, int] = {}
    for (u, _), d in below.items():
        by_uplink[u] = by_uplink.get(u, 0) + d
    for leaf, s_l in senders.items():
        for u in range(up):
            upper = f"agg{leaf // per_pod}.{u}" if three else f"spine{u}"
            counts.add(tree._leaf_name(leaf), upper,
                       s_l * (by_uplink.get(u, 0) - below.get((u, leaf), 0)))
            counts.add(upper, tree._leaf_name(leaf), below.get((u, leaf), 0) * (n - s_l))
    if not three:
        return
    pods: dict[int, int] = {}
    for leaf, s_l in senders.items():
        pods[leaf // per_pod] = pods.get(leaf // per_pod, 0) + s_l
    by_core: dict[tuple[int, int], int] = {}
    for (u, c, _), d in cores.items():
        by_core[(u, c)] = by_core.get((u, c), 0) + d
    for p, s_p in pods.items():
        for (u, c), d_uc in by_core.items():
            agg, core = f"agg{p}.{u}", f"core{u}.{c}"
            counts.add(agg, core, s_p * (d_uc - cores.get((u, c, p), 0)))
            counts.add(core, agg, cores.get((u, c, p), 0) * (total - s_p))


def _representatives(cluster: Cluster, servers: dict[int, list[int]]) -> list[tuple[int, ...]]:
    """Routes of every member pair of one server pair per relation: the same server, the
    same leaf, the same pod, different pods (rails: any two servers)."""
    fabric, gpus = cluster.fabric, cluster.devices_per_server
    firsts: dict[tuple[int, ...], list[int]] = {}  # relation key of a server -> its servers
    for s in servers:
        if isinstance(fabric, FatTree):
            leaf = fabric._leaf(s * fabric.server.nics)
            firsts.setdefault((leaf // fabric.per_pod, leaf), []).append(s)
        else:
            firsts.setdefault((), []).append(s)
    pairs: list[tuple[int, int]] = []
    keys = list(firsts)
    first = keys[0]
    pairs.append((firsts[first][0], firsts[first][0]))
    same = next((v for v in firsts.values() if len(v) > 1), None)
    if same:
        pairs.append((same[0], same[1]))
    pod_of = {k: k[0] if k else 0 for k in keys}
    by_pod: dict[int, list[tuple[int, ...]]] = {}
    for k in keys:
        by_pod.setdefault(pod_of[k], []).append(k)
    two_leaves = next((v for v in by_pod.values() if len(v) > 1), None)
    if two_leaves:
        pairs.append((firsts[two_leaves[0]][0], firsts[two_leaves[1]][0]))
    pods = list(by_pod.values())
    if len(pods) > 1:
        pairs.append((firsts[pods[0][0]][0], firsts[pods[1][0]][0]))
    local = servers[pairs[0][0]]
    return [hop(cluster, sa * gpus + i, sb * gpus + k) for sa, sb in pairs
            for i in local for k in local if (sa, i) != (sb, k)]


def enumerated(cluster: Cluster, group: Sequence[int]) -> FlowSet:
    """The same flow set routed pair by pair (what `lower_direct` did for every group; the
    reference the tests compare with)."""
    pairs = len(group) * (len(group) - 1)
    if pairs > MAX_ROUTED_PAIRS:
        raise ConfigError(f"all_to_all: {len(group):,} ranks make {pairs:,} flows to route one "
                          f"by one, more than the {MAX_ROUTED_PAIRS:,} parasim routes (it counts "
                          f"them by class on a fat tree or rails, over the same GPUs of every "
                          f"server)")
    routes = [hop(cluster, a, b) for a in group for b in group if a != b]
    latency = max(cluster.path_latency(r) for r in routes)
    return flowset(cluster, routes, latency)
