"""`Cluster`: the graph, the accelerators in rank order, and routes as tuples of link ids.

Links are directed; each has a dense integer id so the network model can keep per-link state in
flat lists. Routing is delegated to the fabric (switched or torus) and cached per
(source, destination, NIC) triple. A cluster is made from a `networkx.DiGraph` or from the
`GraphBuilder` that records one (`source`); `graph` is that graph, built from the builder's
record the first time something asks for it (the flat link lists are all the network model
and the arithmetic routes of `topology.links` need).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import networkx as nx

from topology.builder import GraphBuilder
from topology.variability import IDEAL, Variability
from traces.cluster_table import ClusterTable

LINK_KINDS = ("nvlink", "pcie", "ib", "ici", "loopback")
"""Every class of link (`kind` of an edge) the builders make: NVLink to the switch, PCIe to
the NIC, InfiniBand, a TPU torus's ICI, and the localhost server's loopback."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """One GPU or chip: what the compute and memory models need to know about it."""

    name: str
    peak_flops: float
    """Dense bf16 tensor FLOP/s (no sparsity)."""
    memory_bytes: float
    """HBM capacity."""
    hbm_bandwidth_Bps: float
    compute_units: int = 1
    """Units that run GEMM tiles in parallel (a GPU's SMs, a TPU's matrix units): a GEMM of
    fewer tiles than units leaves some idle (wave quantization)."""
    peak_flops_fp8: float = 0.0
    """Dense FP8 tensor FLOP/s (no sparsity); 0 for an accelerator without FP8 (A100, TPU v4)."""
    peak_flops_fp4: float = 0.0
    """Dense FP4 tensor FLOP/s (no sparsity; NVFP4's block-scaled E2M1 GEMMs); 0 for an
    accelerator without FP4 tensor cores (Hopper and older, TPU v4)."""
    fp8_block_scaling: bool = False
    """FP8 GEMMs with hardware block scales (Blackwell's MXFP8): `traces.fp8` explains what it
    changes."""
    peak_clock_MHz: float = 0.0
    """The clock `peak_flops` is counted at (the data sheet's); 0: no clock figure, and the
    sustained rate is the peak."""
    sustained_clock_MHz: float = 0.0
    """The clock the chip holds through hours of back-to-back GEMMs at its power limit
    (measured: below the boost clock a short benchmark sees); 0: the peak clock."""
    int32_ops_per_s: float = 0.0
    """32-bit integer instructions per second at the sustained clock (a GPU's INT32 lanes:
    SMs x lanes x clock), which random draws run on (dropout's Philox, `sim.models.compute`);
    0: none modelled, draws cost nothing (a TPU, a calibrated CPU host)."""
    exp_per_clock: int = 0
    """Exponentials (MUFU.EX2 results) a clock per compute unit: a GPU's special-function
    units, which run softmax's exponentials beside the tensor cores (`sim.models.rates` turns
    Blackwell Ultra's doubled rate into flash attention's efficiency); 0: not known."""

    @property
    def sustained_flops(self) -> float:
        """Dense FLOP/s at the sustained clock: `peak_flops · sustained / peak clock`, the
        roof the compute model's efficiencies are relative to (docs/sustained-rates.md)."""
        return self._at_sustained_clock(self.peak_flops)

    @property
    def sustained_flops_fp8(self) -> float:
        """Dense FP8 FLOP/s at the sustained clock, as `sustained_flops`."""
        return self._at_sustained_clock(self.peak_flops_fp8)

    @property
    def sustained_flops_fp4(self) -> float:
        """Dense FP4 FLOP/s at the sustained clock, as `sustained_flops`."""
        return self._at_sustained_clock(self.peak_flops_fp4)

    def _at_sustained_clock(self, peak: float) -> float:
        """A clock-bound `peak` rate scaled from the peak to the sustained clock (itself where
        either clock is not known)."""
        if not (self.peak_clock_MHz and self.sustained_clock_MHz):
            return peak
        return peak * self.sustained_clock_MHz / self.peak_clock_MHz

    @property
    def sustained_exp_per_s(self) -> float:
        """Exponentials a second at the sustained clock: units x `exp_per_clock` x clock (0
        where either figure is missing)."""
        clock = self.sustained_clock_MHz or self.peak_clock_MHz
        return self.compute_units * self.exp_per_clock * clock * 1e6

    @property
    def sustained_hbm_Bps(self) -> float:
        """HBM bandwidth under sustained load: the data sheet's, since the power limit lowers
        the SM clock, not the memory clock (HBM runs at its one fixed clock: `nvidia-smi`
        cannot lock A100's memory clock, 1215 MHz)."""
        return self.hbm_bandwidth_Bps


class Fabric(Protocol):
    """Routing for one family of topologies."""

    kind: str

    def path(self, src: int, dst: int, nic: int | None, qp: int = 0) -> list[str]:
        """Graph nodes from accelerator `src` to `dst` (both endpoints included).

        `nic` pins the NIC index used at both ends (one channel of a multi-rail collective);
        None lets the fabric choose its default. `qp`: the connection's queue pair (only a
        hashing fabric routes them apart).
        """
        ...


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """A built cluster. Constructed by the builders in `topology.config`; never mutated."""

    name: str
    source: nx.DiGraph | GraphBuilder
    """The graph, or the builder that records it (`graph` builds it on first use)."""
    devices: tuple[str, ...]
    """Accelerator node names; index = global rank."""
    accelerator: Accelerator
    devices_per_server: int
    """Accelerators sharing one server (one NVSwitch domain, or one TPU host)."""
    fabric: Fabric
    table: ClusterTable | None = None
    """The `[cluster]` table it was built from (`topology.config.read_cluster_table` rebuilds
    it; a profile's measured links applied on top, `topology.override`, are not in it); None
    for a cluster built by hand."""
    variability: Variability = IDEAL
    """How its ranks' compute speed varies per step (`sim.models.variability`)."""
    cores: int = 0
    """CPU ranks (the localhost preset): the host's cores they share, each rank running one
    thread; 0: unknown, every rank taken to have a core of its own."""
    link_capacity: tuple[float, ...] = field(init=False)
    link_latency: tuple[float, ...] = field(init=False)
    link_kind: tuple[str, ...] = field(init=False)
    link_ends: tuple[tuple[str, str], ...] = field(init=False)
    _routes: dict[tuple[int, int, int | None], tuple[int, ...]] = field(
        init=False, default_factory=dict, repr=False, compare=False
    )
    _connections: dict[tuple[int, ...], tuple[int, int, int | None]] = field(
        init=False, default_factory=dict, repr=False, compare=False
    )
    """The ends (src, dst, nic) of each route `route` made, where connections have several
    queue pairs (`spread`)."""
    memo: dict[str, object] = field(init=False, default_factory=dict, repr=False,
                                    compare=False)
    """What is derived from the cluster once: its graph from a builder, the link ids by end
    nodes, `topology.links.link_index`."""

    def __post_init__(self) -> None:
        source = self.source
        if isinstance(source, GraphBuilder):
            capacity, latency, kind = source.bandwidth, source.latency, source.kind
            ends: list[tuple[str, str]] | tuple[tuple[str, str], ...] = source.ends
        else:
            edges = sorted(source.edges(data=True), key=lambda e: e[2]["id"])
            assert [e[2]["id"] for e in edges] == list(range(len(edges))), \
                "link ids must be dense"
            capacity = [e[2]["bandwidth"] for e in edges]
            latency = [e[2]["latency"] for e in edges]
            kind = [e[2]["kind"] for e in edges]
            ends = [(e[0], e[1]) for e in edges]
        object.__setattr__(self, "link_capacity", tuple(capacity))
        object.__setattr__(self, "link_latency", tuple(latency))
        object.__setattr__(self, "link_kind", tuple(kind))
        assert set(self.link_kind) <= set(LINK_KINDS), f"link kinds {set(self.link_kind)}"
        object.__setattr__(self, "link_ends", tuple(ends))

    @property
    def graph(self) -> nx.DiGraph:
        """The cluster's graph (built from its builder's record on first use)."""
        if isinstance(self.source, nx.DiGraph):
            return self.source
        return self.source.graph()

    @property
    def _link_ids(self) -> dict[tuple[str, str], int]:
        """Link id by (from node, to node): what `route` looks up per hop, without networkx
        (made on first use)."""
        ids = self.memo.get("link_ids")
        if ids is None:
            ids = self.memo["link_ids"] = {ends: i for i, ends in enumerate(self.link_ends)}
        assert isinstance(ids, dict)
        return ids

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def device_words(self) -> tuple[str, str]:
        """What to call one device and several in printed text: chips on a torus (TPU pods),
        CPU ranks on the local host (processes, not accelerators), GPUs elsewhere."""
        if self.fabric.kind == "torus":
            return "chip", "chips"
        if self.accelerator.name.startswith("CPU"):
            return "CPU rank", "CPU ranks"
        return "GPU", "GPUs"

    def time_shared(self, threads: float) -> float:
        """How many times longer a rank's host work takes when `threads` runnable threads (its
        single-threaded ranks, and any other load) share one server's `cores`: the scheduler
        gives each cores/threads of a core, so threads/cores where they outnumber the cores,
        else 1 (and 1 where cores is unknown)."""
        return max(1.0, threads / self.cores) if self.cores else 1.0

    @property
    def num_servers(self) -> int:
        return self.num_devices // self.devices_per_server

    def server_of(self, device: int) -> int:
        return device // self.devices_per_server

    def route(self, src: int, dst: int, nic: int | None = None) -> tuple[int, ...]:
        """Link ids from accelerator `src` to `dst` (its first queue pair's); empty when
        src == dst."""
        key = (src, dst, nic)
        cached = self._routes.get(key)
        if cached is None:
            nodes = self.fabric.path(src, dst, nic) if src != dst else []
            ids = self._link_ids
            cached = tuple([ids[u, v] for u, v in zip(nodes, nodes[1:])])
            self._routes[key] = cached
            if self.qps > 1:
                self._connections.setdefault(cached, (src, dst, nic))
        return cached

    @property
    def qps(self) -> int:
        """Queue pairs a connection is split over that the fabric routes apart: the fat
        tree's `qps_per_connection` where it hashes (ECMP), else 1 (every queue pair would
        take the same path). Every flow set on this cluster counts its flows' queue pairs
        (`sim.engine.flows.FlowSet.qps`)."""
        spec = getattr(self.fabric, "spec", None)
        if spec is None or getattr(spec, "routing", None) != "ecmp":
            return 1
        return int(getattr(spec, "qps_per_connection", 1))

    def spread(self, routes: Iterable[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Each route (of `route`) replaced by the routes of its connection's `qps` queue
        pairs; the routes themselves where a connection has one."""
        qps = self.qps
        if qps == 1:
            return list(routes)
        out: list[tuple[int, ...]] = []
        for first in routes:
            out.extend(self._queue_pairs(first, qps))
        return out

    def _queue_pairs(self, first: tuple[int, ...], qps: int) -> tuple[tuple[int, ...], ...]:
        """The routes of the `qps` queue pairs of the connection whose first is `first`
        (made once per connection)."""
        memo = self.memo.setdefault("queue_pairs", {})
        assert isinstance(memo, dict)
        found = memo.get(first)
        if found is None:
            ends = self._connections.get(first)
            if ends is None:  # not a route of `route` (empty, or built by hand): as it is
                found = (first,) * qps
            else:
                ids = self._link_ids
                paths = [self.fabric.path(*ends, qp) for qp in range(1, qps)]
                found = (first, *(tuple([ids[u, v] for u, v in zip(p, p[1:])])
                                  for p in paths))
            memo[first] = found
        return found

    def link(self, src: str, dst: str) -> int:
        """The id of the directed link between two graph nodes."""
        return self._link_ids[src, dst]

    def path_latency(self, links: tuple[int, ...]) -> float:
        return sum(map(self.link_latency.__getitem__, links))  # in order, as a loop would
