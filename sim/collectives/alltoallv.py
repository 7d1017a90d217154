"""All-to-all-v's flows: one flow set per distinct per-peer size, counted per link by class.

An uneven all-to-all (`traces.alltoallv.AllToAllv`) sends `sizes[k]` to member k from every
member (a dispatch) or from member k to every member (a combine). The pairs that carry one
size form a flow set carrying that size, all sets of the exchange in one round: alone on the
network the round takes what max-min sharing of their links gives (`sim.engine.flows`), so a
member that receives (or sends) more keeps its links busy longer and the exchange ends when
its bytes have moved; no link ever carries more than its rate.

Each set is the flows from every chosen sender to every chosen receiver (a != b), counted per
link without routing them one by one, by the same routes `sim.collectives.alltoall` counts
(receiver's NIC index across servers, a PXN hop over NVLink first where the sender's own NIC
is another; destination-mod-k uplinks), now with senders A and receivers B apart. With A_s and
B_s the members of server s, B_j (B_s,j) the receivers on NIC j (of server s):

  - NVLink in server s: i in A_s sends |B_s| - [i in B_s]; k in B_s receives |A_s| - [k in A_s];
  - i in A_s to NIC j (via its PXN GPU): B_j - B_s,j; NIC of k in B_s to k: |A| - |A_s|;
  - NIC (s, j) up: |A_s| (B_j - B_s,j); down: B_s,j (|A| - |A_s|);
  - leaf l up to uplink u: S_l (U_u - U_u,l); down: U_u,l (|A| - S_l) (S_l senders under l,
    U_u,l receivers under l whose NIC's global index is = u mod the uplinks); three tiers:
    the same between pod aggregation and core with pods for leaves.

Every set waits the latency of the exchange's longest route (the grouped sends start together;
the NCCL model replaces it with NCCL's own, `sim.collectives.nccl_p2p`).
tests/sim/collectives/test_alltoallv.py checks the counts against routing pair by pair.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import chain

from sim.collectives.alltoall import (
    MAX_ROUTED_PAIRS,
    LinkCounts,
    all_to_all_flows,
    enumerated,
)
from sim.collectives.base import Lowering, hop
from sim.engine.flows import FlowSet
from topology.cluster import Cluster
from topology.fabric import FatTree, Rails
from topology.server import gpu_node, nic_node, nvswitch_node
from traces.alltoallv import AllToAllv
from traces.errors import ConfigError


def lower_alltoallv(cluster: Cluster, group: Sequence[int], split: AllToAllv) -> Lowering:
    """One round: per distinct per-peer size, the flows that carry it, each carrying its size
    as a fraction of the mean buffer (`split.mean_send_bytes`)."""
    group = tuple(group)
    assert split.num_ranks == len(group), "one size per member"
    whole = all_to_all_flows(cluster, group) or enumerated(cluster, group)
    mean = split.mean_send_bytes
    sets = []
    for size, members in split.classes():
        chosen = [group[k] for k in members]
        senders, receivers = (chosen, group) if split.by_sender else (group, chosen)
        sets.append((pair_flows(cluster, senders, receivers, whole.latency_s), size / mean))
    return (tuple(sets),)


def pair_flows(cluster: Cluster, senders: Sequence[int], receivers: Sequence[int],
               latency_s: float) -> FlowSet:
    """Every sender sending one flow to every receiver but itself, counted by class where the
    fabric allows (module docstring), else routed pair by pair."""
    counts = counted(cluster, senders, receivers)
    if counts is None:
        counts = routed(cluster, senders, receivers)
    return FlowSet.from_counts(counts, latency_s, cluster.link_capacity)


def routed(cluster: Cluster, senders: Sequence[int], receivers: Sequence[int]) -> Counter[int]:
    """Flows per link, routed pair by pair (the reference of the counting)."""
    pairs = len(senders) * len(receivers)
    if pairs > MAX_ROUTED_PAIRS:
        raise ConfigError(f"all_to_all: {pairs:,} uneven flows to route one by one, more than "
                          f"the {MAX_ROUTED_PAIRS:,} parasim routes (it counts them by class on "
                          f"a fat tree or rails)")
    routes = [hop(cluster, a, b) for a in senders for b in receivers if a != b]
    return Counter(chain.from_iterable(routes))


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
    servers = sorted(set(sends) | set(takes))
    fabric_side: dict[tuple[int, int], tuple[int, int]] = {}  # (s, j) -> (up, down)
    for s in servers:
        a_s, b_s, row = sends.get(s, []), takes.get(s, []), on_nic.get(s, {})
        set_a, set_b = set(a_s), set(b_s)
        switch = nvswitch_node(s)
        for i in a_s:
            counts.add(gpu_node(s, i), switch, len(b_s) - (i in set_b))
        for k in b_s:
            counts.add(switch, gpu_node(s, k), len(a_s) - (k in set_a))
        for i in a_s:
            for j, b_j in total_nic.items():
                out = b_j - row.get(j, 0)
                via = owner_of(j, prefer=i)
                if via != i:
                    counts.add(gpu_node(s, i), switch, out)
                    counts.add(switch, gpu_node(s, via), out)
                counts.add(gpu_node(s, via), nic_node(s, j), out)
        for k in b_s:
            counts.add(nic_node(s, nic_of(k)), gpu_node(s, k), num_a - len(a_s))
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
                key = (u, (g // up) % per_pod, leaf // per_pod)
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
