"""Switched fabrics between servers: a two- or three-tier fat tree and a rail-optimized fabric.

Both route deterministically. The fat tree uses destination-mod-k up-routing (InfiniBand's
ftree engine does the same): the uplink taken at each tier is picked by the destination NIC's
index, which spreads shift permutations such as a ring without collisions. Down-routes are
unique. A rail fabric puts NIC i of every server on rail switch i; traffic between different
rails first crosses NVLink to the GPU on the destination's rail (NCCL's PXN).
"""

from __future__ import annotations

from dataclasses import dataclass

from topology.builder import GraphBuilder
from topology.server import ServerSpec, gpu_node, intra_server_path, nic_node, nvswitch_node
from traces.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class FatTreeSpec:
    nodes_per_leaf: int
    """Servers under one leaf switch (all NICs of a server on the same leaf)."""
    oversubscription: float = 1.0
    """Leaf down-port bandwidth over up-port bandwidth (2.0 means 2:1)."""
    tiers: int = 2
    leaves_per_pod: int = 0
    """Leaves per pod in a three-tier tree (0 = all leaves in one pod)."""
    link_latency_s: float
    """Latency of one switch hop (port-to-port plus cable)."""


class SwitchedFabric:
    """Routing shared by switched fabrics: NVSwitch inside a server, NICs between servers."""

    kind = "switched"

    def __init__(self, server: ServerSpec, *, sharp: bool = False) -> None:
        self.server = server
        self.sharp = sharp  # the switches reduce in the network (SHARP): NCCL's CollNet runs

    def path(self, src: int, dst: int, nic: int | None) -> list[str]:
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
        return head + self.nic_path(sa, na, sb, nb) + tail

    def nics_for(self, ia: int, ib: int, nic: int | None) -> tuple[int, int]:
        """NIC indices used at the source and destination server."""
        if nic is not None:
            return nic, nic
        return self.server.nic_of(ia), self.server.nic_of(ib)

    def nic_path(self, sa: int, na: int, sb: int, nb: int) -> list[str]:
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

    def build(self, builder: GraphBuilder, num_servers: int, nic_Bps: float) -> None:
        lat = self.spec.link_latency_s

        def uplink(lower: str, upper: str) -> None:
            builder.link(lower, upper, bandwidth=nic_Bps, latency=lat, kind="ib")

        for s in range(num_servers):
            for j in range(self.server.nics):
                leaf = self._leaf_name(self._leaf(s * self.server.nics + j))
                if leaf not in builder.graph:
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
            for c in range(self.per_pod):
                core = builder.node(f"core{u}.{c}", "core")
                for pod in range(num_pods):
                    uplink(f"agg{pod}.{u}", core)

    def _leaf(self, global_nic: int) -> int:
        return global_nic // self.down

    @staticmethod
    def _leaf_name(leaf: int) -> str:
        return f"leaf{leaf}"

    def nic_path(self, sa: int, na: int, sb: int, nb: int) -> list[str]:
        ga, gb = sa * self.server.nics + na, sb * self.server.nics + nb
        la, lb = self._leaf(ga), self._leaf(gb)
        a, b = nic_node(sa, na), nic_node(sb, nb)
        if la == lb:
            return [a, self._leaf_name(la), b]
        u = gb % self.up  # destination-mod-k: the uplink is chosen by the destination
        if self.spec.tiers == 2:
            return [a, self._leaf_name(la), f"spine{u}", self._leaf_name(lb), b]
        pa, pb = la // self.per_pod, lb // self.per_pod
        if pa == pb:
            return [a, self._leaf_name(la), f"agg{pa}.{u}", self._leaf_name(lb), b]
        c = (gb // self.up) % self.per_pod
        return [a, self._leaf_name(la), f"agg{pa}.{u}", f"core{u}.{c}", f"agg{pb}.{u}",
                self._leaf_name(lb), b]


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

    def nic_path(self, sa: int, na: int, sb: int, nb: int) -> list[str]:
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
