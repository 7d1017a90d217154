"""All-to-all's flows counted per link by class, without routing its n·(n−1) flows one by one.

`lower_direct` (`sim.collectives.direct`) routes every pair (`hop`: across servers on the
receiver's NIC index at both ends, a PXN hop over NVLink first where the sender's own NIC is
another) and counts the flows per link: n² routes, 67 M at 8192 GPUs. On a switched fabric
(`topology.fabric`: a two- or three-tier fat tree, rails) the routes have a structure that
gives every link's count in closed form from a few sums over the members. `counted` takes
senders A and receivers B apart (all-to-all: both the group; an uneven all-to-all's size
classes, `sim.collectives.alltoallv`: some of it); with A_s and B_s the members of server s,
B_j (B_s,j) the receivers on NIC j (of server s):

  - NVLink in server s: i in A_s sends |B_s| - [i in B_s]; k in B_s receives |A_s| - [k in A_s];
  - i in A_s to NIC j (via its PXN GPU): B_j - B_s,j; NIC of k in B_s to k: |A| - |A_s|;
  - NIC (s, j) up: |A_s| (B_j - B_s,j); down: B_s,j (|A| - |A_s|);
  - leaf l up to uplink u: S_l (U_u - U_u,l); down: U_u,l (|A| - S_l) (S_l senders under l,
    U_u,l receivers under l whose NIC's global index is = u mod the uplinks,
    destination-mod-k up-routing, `FatTree.nic_path`); three tiers: the same between pod
    aggregation and core with pods for leaves, receivers grouped by (u, c).

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
from topology.server import gpu_node, nic_node, nvswitch_node
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
    if len(group) < AGGREGATE_FROM or len(set(group)) != len(group):
        return None
    servers: dict[int, list[int]] = {}
    for rank in group:
        s, i = divmod(rank, cluster.devices_per_server)
        servers.setdefault(s, []).append(i)
    local = sorted(next(iter(servers.values())))
    if any(sorted(v) != local for v in servers.values()):  # the latency's representatives
        return None
    counts = counted(cluster, group, group)
    if counts is None:
        return None
    latency = max(cluster.path_latency(route) for route in _representatives(cluster, servers))
    assert cluster.qps == 1, "counted by class only where routes are not hashed"
    return FlowSet.from_counts(counts, latency, cluster.link_capacity)


class LinkCounts:
    """Flows per link id, added by the link's end nodes."""

    def __init__(self, cluster: Cluster) -> None:
        self.link = cluster.link
        self.by_link: dict[int, int] = {}

    def add(self, u: str, v: str, flows: int) -> None:
        if flows:
            link = self.link(u, v)
            self.by_link[link] = self.by_link.get(link, 0) + flows


def counted(cluster: Cluster, senders: Sequence[int], receivers: Sequence[int]
            ) -> dict[int, int] | None:
    """Flows per link of senders x receivers by the module's sums; None where the fabric has
    no such structure (a torus, hashed uplinks, servers unlike the fabric's)."""
    fabric = cluster.fabric
    if not isinstance(fabric, FatTree | Rails) or not getattr(fabric, "symmetric", True):
        return None
    spec = fabric.server
    if spec.gpus != cluster.devices_per_server or spec.nics == 0:
        return None
    gpus, nic_of, owner_of = spec.gpus, spec.nic_of, spec.owner_of
    sends: dict[int, list[int]] = {}
    takes: dict[int, list[int]] = {}
    for a in senders:
        s, i = divmod(a, gpus)
        sends.setdefault(s, []).append(i)
    on_nic: dict[int, dict[int, int]] = {}  # B_s,j
    for b in receivers:
        s, k = divmod(b, gpus)
        takes.setdefault(s, []).append(k)
        row = on_nic.setdefault(s, {})
        row[nic_of(k)] = row.get(nic_of(k), 0) + 1
    total_nic: dict[int, int] = {}  # B_j
    for row in on_nic.values():
        for j, d in row.items():
            total_nic[j] = total_nic.get(j, 0) + d
    num_a = len(senders)
    counts = LinkCounts(cluster)
    add = counts.add
    servers = sorted(set(sends) | set(takes))
    fabric_side: dict[tuple[int, int], tuple[int, int]] = {}  # (s, j) -> (up, down)
    # The PXN GPU of each (NIC, sender) pair, asked once, not once per server.
    via_of = {j: [owner_of(j, prefer=i) for i in range(gpus)] for j in total_nic}
    for s in servers:
        a_s, b_s, row = sends.get(s, []), takes.get(s, []), on_nic.get(s, {})
        set_a, set_b = set(a_s), set(b_s)
        switch = nvswitch_node(s)
        gpu = [gpu_node(s, g) for g in range(gpus)]  # the server's node names, made once
        nic = [nic_node(s, j) for j in range(spec.nics)]
        for i in a_s:
            add(gpu[i], switch, len(b_s) - (i in set_b))
        for k in b_s:
            add(switch, gpu[k], len(a_s) - (k in set_a))
        outs = [(j, b_j - row.get(j, 0)) for j, b_j in total_nic.items()]
        for i in a_s:
            for j, out in outs:
                via = via_of[j][i]
                if via != i:
                    add(gpu[i], switch, out)
                    add(switch, gpu[via], out)
                add(gpu[via], nic[j], out)
        for k in b_s:
            add(nic[nic_of(k)], gpu[k], num_a - len(a_s))
        for j in set(total_nic) | set(row):
            fabric_side[(s, j)] = (len(a_s) * (total_nic.get(j, 0) - row.get(j, 0)),
                                   row.get(j, 0) * (num_a - len(a_s)))
    if isinstance(fabric, Rails):
        for (s, j), (up, down) in fabric_side.items():
            counts.add(nic_node(s, j), f"rail{j}", up)
            counts.add(f"rail{j}", nic_node(s, j), down)
    else:
        _fat_tree(counts, fabric, sends, on_nic, fabric_side, num_a)
    return counts.by_link


def _fat_tree(counts: LinkCounts, tree: FatTree, sends: dict[int, list[int]],
              on_nic: dict[int, dict[int, int]], fabric_side: dict[tuple[int, int],
                                                                  tuple[int, int]],
              num_a: int) -> None:
    """NIC to leaf and back, leaf to spine (pod aggregation) and back, aggregation to core."""
    nics, up, per_pod = tree.server.nics, tree.up, tree.per_pod
    three = tree.spec.tiers != 2
    for (s, j), (upward, down) in fabric_side.items():
        leaf_name = tree._leaf_name(tree._leaf(s * nics))
        counts.add(nic_node(s, j), leaf_name, upward)
        counts.add(leaf_name, nic_node(s, j), down)
    senders: dict[int, int] = {}  # S_l
    below: dict[tuple[int, int], int] = {}  # U_u,l
    cores: dict[tuple[int, int, int], int] = {}  # receivers in pod p on core (u, c)
    leaves: set[int] = set()
    for s in set(sends) | set(on_nic):
        leaf = tree._leaf(s * nics)
        leaves.add(leaf)
        senders[leaf] = senders.get(leaf, 0) + len(sends.get(s, []))
        for j, d in on_nic.get(s, {}).items():
            g = s * nics + j
            u = g % up
            below[(u, leaf)] = below.get((u, leaf), 0) + d
            if three:
                key = (u, tree.core_of(g), leaf // per_pod)
                cores[key] = cores.get(key, 0) + d
    by_uplink: dict[int, int] = {}
    for (u, _), d in below.items():
        by_uplink[u] = by_uplink.get(u, 0) + d
    for leaf in sorted(leaves):
        s_l = senders.get(leaf, 0)
        for u in range(up):
            upper = f"agg{leaf // per_pod}.{u}" if three else f"spine{u}"
            under = below.get((u, leaf), 0)
            counts.add(tree._leaf_name(leaf), upper, s_l * (by_uplink.get(u, 0) - under))
            counts.add(upper, tree._leaf_name(leaf), under * (num_a - s_l))
    if not three:
        return
    pods: dict[int, int] = {}
    for leaf in leaves:
        pods[leaf // per_pod] = pods.get(leaf // per_pod, 0) + senders.get(leaf, 0)
    by_core: dict[tuple[int, int], int] = {}
    for (u, c, _), d in cores.items():
        by_core[(u, c)] = by_core.get((u, c), 0) + d
    for p, s_p in sorted(pods.items()):
        for (u, c), d_uc in by_core.items():
            agg, core = f"agg{p}.{u}", f"core{u}.{c}"
            mine = cores.get((u, c, p), 0)
            counts.add(agg, core, s_p * (d_uc - mine))
            counts.add(core, agg, mine * (num_a - s_p))


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
