"""Switched fabrics between servers: a two- or three-tier fat tree and a rail-optimized fabric.

Both route deterministically. The fat tree picks the uplink at each tier by its `routing`
(`topology.variability.Routing`): by default destination-mod-k (InfiniBand's ftree engine does
the same): the uplink is picked by the destination NIC's index, which spreads shift
permutations such as a ring without collisions; `ecmp`: by a seeded hash of the flow's
RoCEv2 5-tuple (source and destination NIC, UDP source port from the queue pair, destination
port 4791, UDP), as Ethernet switches spread flows, so two flows may hash onto one uplink and
share it; `adaptive`: onto the uplink (and downlink) that carries the fewest routes placed so
far, ties to the destination-mod-k choice, as adaptive routing keeps flows apart. Queue pairs
per connection: `qps_per_connection` (NCCL_IB_QPS_PER_CONNECTION, default 1, NCCL user guide,
"Environment Variables"); NCCL splits a connection's messages evenly over its queue pairs, and
under `ecmp` each queue pair (its own UDP source port) is hashed on its own, so a connection
spreads over up to that many uplinks (`path(..., qp=k)`); every channel of a collective is its
own connection (its own NIC index here), so its own hashes. Down-routes are unique.
A rail fabric puts NIC i of every server on rail switch i; traffic between different
rails first crosses NVLink to the GPU on the destination's rail (NCCL's PXN).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from topology.builder import GraphBuilder
from topology.server import ServerSpec, gpu_node, intra_server_path, nic_node, nvswitch_node
from topology.variability import Routing
from traces.errors import ConfigError

ROCE_UDP_PORT = 4791  # RoCEv2's UDP destination port (IANA)
UDP = 17

@dataclass(frozen=True, slots=True, kw_only=True)
class FatTreeSpec:
    nodes_per_leaf: int
    """Servers under one leaf switch (all NICs of a server on the same leaf)."""
    oversubscription: float = 1.0
    """Leaf down-port bandwidth over up-port bandwidth (2.0 means 2:1)."""
    tiers: int = 2
    leaves_per_pod: int = 0
    """Leaves per pod in a three-tier tree (0 = all leaves in one pod)."""
    pod_oversubscription: float = 1.0
    """Three tiers: a pod's down bandwidth over its bandwidth to the core (7.0 means 1:7, the
    Llama 3 paper's cluster above its 3,072-GPU pods); fewer core switches per plane."""
    link_latency_s: float
    """Latency of one switch hop (port-to-port plus cable)."""
    routing: Routing = Routing.DMODK
    routing_seed: int = 0
    """Seed of the ECMP hash (switches seed theirs; a different seed, other collisions)."""
    qps_per_connection: int = 1
    """Queue pairs per connection (NCCL_IB_QPS_PER_CONNECTION; NCCL's default 1): under ECMP
    each is hashed onto its own path, the connection's bytes split evenly among them."""


class SwitchedFabric:
    """Routing shared by switched fabrics: NVSwitch inside a server, NICs between servers."""

    kind = "switched"
    symmetric = True
    """Whether shifting a flow's ends by whole servers shifts its route (folding relies on
    it, `sim.engine.lowering`): false where hashing or load picks the uplinks."""

    def __init__(self, server: ServerSpec, *, sharp: bool = False) -> None:
        self.server = server
        self.sharp = sharp  # the switches reduce in the network (SHARP): NCCL's CollNet runs

    def path(self, src: int, dst: int, nic: int | None, qp: int = 0) -> list[str]:
        """Graph nodes from GPU `src` to `dst` (across servers by NIC `nic`, None: each
        end's nearest), for queue pair `qp` of the connection."""
        spec = self.server
        sa, ia = divmod(src, spec.gpus)
        sb, ib = divmod(dst, spec.gpus)
        if sa == sb:
            return intra_server_path(spec, sa, ia, ib)
        na, nb = self.nics_for(ia, ib, nic)
        via_a = spec.owner_of(na, prefer=ia)
        via_b = spec.owner_of(nb, prefer=ib)
        head = intra_server_path(spec, sa, ia, via_a)
        tail = intra_server_path(spec, sb, via_b, ib)
        return head + self.nic_path(sa, na, sb, nb, qp) + tail

    def nics_for(self, ia: int, ib: int, nic: int | None) -> tuple[int, int]:
        """NIC indices used at the source and destination server."""
        if nic is not None:
            return nic, nic
        return self.server.nic_of(ia), self.server.nic_of(ib)

    def nic_path(self, sa: int, na: int, sb: int, nb: int, qp: int = 0) -> list[str]:
        raise NotImplementedError


class FatTree(SwitchedFabric):
    """Leaves of `nodes_per_leaf` servers, spines above them (and a core tier when 3 tiers)."""

    kind = "fat-tree"

    def __init__(self, server: ServerSpec, spec: FatTreeSpec, num_servers: int, *,
                 sharp: bool = False) -> None:
        super().__init__(server, sharp=sharp)
        self.spec = spec
        self.down = spec.nodes_per_leaf * server.nics
        self.up = uplinks(self.down, spec.oversubscription)
        self.num_leaves = -(-num_servers // spec.nodes_per_leaf)
        self.per_pod = spec.leaves_per_pod or self.num_leaves
        self.cores = max(1, round(self.per_pod / spec.pod_oversubscription))
        """Core switches per uplink plane: one per leaf of a pod when the pods are not
        oversubscribed, per_pod / pod_oversubscription (whole switches) when they are."""
        self.symmetric = spec.routing is Routing.DMODK
        self._placed: dict[tuple[str, int], int] = {}
        """Adaptive routing: routes placed per (leaf, uplink), up and down."""

    def build(self, builder: GraphBuilder, num_servers: int, nic_Bps: float) -> None:
        lat = self.spec.link_latency_s

        def uplink(lower: str, upper: str) -> None:
            builder.link(lower, upper, bandwidth=nic_Bps, latency=lat, kind="ib")

        for s in range(num_servers):
            for j in range(self.server.nics):
                leaf = self._leaf_name(self._leaf(s * self.server.nics + j))
                if leaf not in builder.nodes:
                    builder.node(leaf, "leaf")
                uplink(nic_node(s, j), leaf)
        if self.num_leaves == 1:
            return
        if self.spec.tiers == 2:
            for u in range(self.up):
                spine = builder.node(f"spine{u}", "spine")
                for index in range(self.num_leaves):
                    uplink(self._leaf_name(index), spine)
            return
        num_pods = -(-self.num_leaves // self.per_pod)
        for pod in range(num_pods):
            for u in range(self.up):
                agg = builder.node(f"agg{pod}.{u}", "spine")
                last = min((pod + 1) * self.per_pod, self.num_leaves)
                for index in range(pod * self.per_pod, last):
                    uplink(self._leaf_name(index), agg)
        if num_pods == 1:
            return
        for u in range(self.up):
            for c in range(self.cores):
                core = builder.node(f"core{u}.{c}", "core")
                for pod in range(num_pods):
                    uplink(f"agg{pod}.{u}", core)

    def _leaf(self, global_nic: int) -> int:
        return global_nic // self.down

    @staticmethod
    def _leaf_name(leaf: int) -> str:
        return f"leaf{leaf}"

    def nic_path(self, sa: int, na: int, sb: int, nb: int, qp: int = 0) -> list[str]:
        ga, gb = sa * self.server.nics + na, sb * self.server.nics + nb
        la, lb = self._leaf(ga), self._leaf(gb)
        a, b = nic_node(sa, na), nic_node(sb, nb)
        if la == lb:
            return [a, self._leaf_name(la), b]
        u, c = self._uplink(ga, gb, la, lb, qp)
        if self.spec.tiers == 2:
            return [a, self._leaf_name(la), f"spine{u}", self._leaf_name(lb), b]
        pa, pb = la // self.per_pod, lb // self.per_pod
        if pa == pb:
            return [a, self._leaf_name(la), f"agg{pa}.{u}", self._leaf_name(lb), b]
        return [a, self._leaf_name(la), f"agg{pa}.{u}", f"core{u}.{c}", f"agg{pb}.{u}",
                self._leaf_name(lb), b]


    def _uplink(self, ga: int, gb: int, la: int, lb: int, qp: int = 0) -> tuple[int, int]:
        """(uplink index, core index) of queue pair `qp` of a flow from global NIC `ga` on
        leaf `la` to `gb` on `lb`, by the fabric's routing (only ECMP tells QPs apart)."""
        routing, up = self.spec.routing, self.up
        if routing is Routing.ECMP:
            h = flow_hash(self.spec.routing_seed, ga, gb, qp)
            return h % up, (h // up) % self.cores
        u = gb % up  # destination-mod-k: the uplink is chosen by the destination
        c = self.core_of(gb)
        if routing is Routing.ADAPTIVE:
            placed = self._placed
            u = min(((u + k) % up for k in range(up)),
                    key=lambda v: placed.get((f"up{la}", v), 0) + placed.get((f"dn{lb}", v), 0))
            placed[(f"up{la}", u)] = placed.get((f"up{la}", u), 0) + 1
            placed[(f"dn{lb}", u)] = placed.get((f"dn{lb}", u), 0) + 1
        return u, c


    def core_of(self, nic: Any) -> Any:
        """The core switch (of its uplink's plane) by which destination-mod-k reaches global NIC
        `nic` from another pod (an int, or a numpy array of them)."""
        return (nic // self.up) % self.cores


def flow_hash(seed: int, src_nic: int, dst_nic: int, qp_index: int = 0) -> int:
    """A switch's ECMP hash of a RoCEv2 flow's 5-tuple: source and destination NIC (their
    addresses), the UDP source port (RoCE derives it from the queue pair: the connection's
    queue pairs, named by its two ends, numbered on from its first), the destination port
    4791 and the protocol. Seeded, stable across runs and platforms (BLAKE2b, not Python's
    salted `hash`)."""
    qp = src_nic * 1_000_003 + dst_nic + qp_index  # the queue pair's number
    sport = 49152 + qp % 16384  # RoCE's source port range (49152-65535)
    key = f"{seed}:{src_nic}:{dst_nic}:{sport}:{ROCE_UDP_PORT}:{UDP}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


class Rails(SwitchedFabric):
    """Rail-optimized: NIC i of every server on rail switch i (one logical non-blocking switch)."""

    kind = "rail"

    def __init__(self, server: ServerSpec, link_latency_s: float, *,
                 sharp: bool = False) -> None:
        super().__init__(server, sharp=sharp)
        self.link_latency_s = link_latency_s

    def build(self, builder: GraphBuilder, num_servers: int, nic_Bps: float) -> None:
        for j in range(self.server.nics):
            rail = builder.node(f"rail{j}", "leaf")
            for s in range(num_servers):
                builder.link(nic_node(s, j), rail, bandwidth=nic_Bps,
                             latency=self.link_latency_s, kind="ib")

    def nics_for(self, ia: int, ib: int, nic: int | None) -> tuple[int, int]:
        rail = self.server.nic_of(ib) if nic is None else nic  # PXN: go to the destination's rail
        return rail, rail

    def nic_path(self, sa: int, na: int, sb: int, nb: int, qp: int = 0) -> list[str]:
        assert na == nb, "rails connect equal NIC indices only"
        return [nic_node(sa, na), f"rail{na}", nic_node(sb, nb)]


def uplinks(down_ports: int, oversubscription: float) -> int:
    """Leaf uplinks for `down_ports` NIC ports at the given oversubscription ratio."""
    if down_ports == 0:
        return 0  # servers without NICs: nothing to uplink (the connectivity check reports it)
    up = down_ports / oversubscription
    if up < 1 or abs(up - round(up)) > 1e-9:
        raise ConfigError(
            f"cluster.oversubscription: {oversubscription:g} must divide the {down_ports} NIC "
            f"ports of a leaf into a whole number of uplinks"
        )
    return round(up)


__all__ = ["FatTree", "FatTreeSpec", "Rails", "SwitchedFabric", "gpu_node", "nvswitch_node"]
