"""Build a `Cluster` from a preset and per-field overrides, as written in `[cluster]` of a TOML.

    [cluster]
    preset = "dgx-h100"      # a key of topology.presets.PRESETS
    nodes = 16
    fabric = "rail"          # fat-tree | rail | torus
    nic_bandwidth = "400Gb/s"
    sharp = true             # the InfiniBand switches reduce in the network (SHARP): NCCL may
                             # run CollNet across nodes; default false (switched presets only)
    gpu_power = "500W"       # the board power limit: the SM clock sustained there
                             # (topology.power); default the preset's TDP

Reading and building are two steps: `read_cluster(table)` checks every key (type, bounds, that
it applies to this preset and fabric) and returns a `ClusterSpec` that knows its size without
building anything, so a caller can compare the accelerator count with a parallel layout before
a graph of 10**30 nodes is even attempted; `ClusterSpec.build()` makes the graph. Every bad
value raises `ConfigError` naming the field, the value and the rule. The spec and the cluster
keep the table as a `traces.cluster_table.ClusterTable` (preset, nodes and fabric resolved),
which a trace carries and `read_cluster_table` reads back into the same spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import networkx as nx

from topology.builder import GraphBuilder
from topology.cluster import Accelerator, Cluster
from topology.fabric import FatTree, FatTreeSpec, Rails
from topology.power import read_gpu_power
from topology.presets import PRESETS, Preset
from topology.server import ServerSpec, add_server
from topology.torus import Torus, TorusSpec
from topology.variability import (
    IDEAL,
    MAX_JITTER,
    MAX_SLOW_FACTOR,
    Routing,
    Variability,
)
from traces.cluster_table import ClusterTable
from traces.errors import ConfigError, show
from traces.fields import (
    MAX_ACCELERATORS,
    MAX_MEMORY_BYTES,
    MAX_TFLOPS,
    MIN_TFLOPS,
    Fields,
)
from traces.files import load_toml

FABRICS = ("fat-tree", "rail", "torus")
MAX_GPUS_PER_NODE = 1024  # an NVLink domain; NVL72 racks hold 72, NVL576 576
MAX_NICS_PER_NODE = 1024
MAX_LEAF_PORTS = 4096  # NIC ports under one leaf switch (real switches have 40-128)
MAX_OVERSUBSCRIPTION = 64.0
MAX_QPS_PER_CONNECTION = 128  # parasim's bound: each queue pair is routed on its own
MAX_CORES = 4096  # parasim's bound on `cores` (the largest hosts have a few hundred)

# Keys by what they apply to; the order is the order of the error message's list.
COMMON_KEYS = ("preset", "nodes", "fabric", "gpus_per_node", "gpu_peak_tflops", "gpu_memory",
               "hbm_bandwidth", "gpu_power", "jitter", "slow_nodes", "slow_factor", "cores")
SERVER_KEYS = ("nvlink_bandwidth", "nvlink_efficiency", "nvlink_latency", "nics_per_node",
               "nic_bandwidth", "nic_efficiency", "pcie_bandwidth", "pcie_latency",
               "switch_latency", "sharp")
FAT_TREE_KEYS = ("nodes_per_leaf", "oversubscription", "tiers", "leaves_per_pod",
                 "pod_oversubscription", "routing", "routing_seed", "qps_per_connection")
TORUS_KEYS = ("dims", "link_bandwidth", "link_latency")
KEYS = (*COMMON_KEYS, *SERVER_KEYS, *FAT_TREE_KEYS, *TORUS_KEYS)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """A checked `[cluster]` table: what `build` needs, and the size it will have."""

    preset: str
    fabric: str
    nodes: int
    accelerator: Accelerator
    server: ServerSpec
    switch_latency_s: float = 0.0
    sharp: bool = False
    """The fabric's switches run SHARP (in-network reduction), so NCCL's CollNet can run."""
    fat_tree: FatTreeSpec | None = None
    torus: TorusSpec | None = None
    table: ClusterTable | None = None
    """The table it was read from (`read_cluster` sets it)."""
    variability: Variability = IDEAL
    cores: int = 0
    """The localhost preset: the CPU cores its ranks share (`Cluster.cores`); 0: unknown."""

    @property
    def num_devices(self) -> int:
        return self.nodes * self.server.gpus

    @property
    def devices_per_server(self) -> int:
        return self.server.gpus

    def build(self) -> Cluster:
        """The graph, its devices in rank order and its routing."""
        builder = GraphBuilder()
        fabric: FatTree | Rails | Torus
        if self.torus is not None:
            fabric = Torus(self.torus)
            devices = fabric.build(builder)
        else:
            devices = [gpu for s in range(self.nodes) for gpu in add_server(builder, s,
                                                                            self.server)]
            nic_Bps = self.server.nic_Bps * self.server.nic_efficiency
            if self.fat_tree is not None:
                fabric = FatTree(self.server, self.fat_tree, self.nodes, sharp=self.sharp)
            else:
                fabric = Rails(self.server, self.switch_latency_s, sharp=self.sharp)
            fabric.build(builder, self.nodes, nic_Bps)
        if self.torus is not None:
            _check_connected(builder.graph(), devices)
        elif self.nodes > 1 and not self.server.nics:  # servers reach each other by NICs only
            _not_connected(devices[self.server.gpus], devices[0])
        return Cluster(
            name=f"{self.preset} x{self.nodes} {self.fabric}",
            source=builder,
            devices=tuple(devices),
            accelerator=self.accelerator,
            devices_per_server=self.server.gpus,
            fabric=fabric,
            table=self.table,
            variability=self.variability,
            cores=self.cores,
        )


def build_cluster(preset: str = "dgx-h100", *, nodes: int | None = None,
                  fabric: str | None = None, **overrides: Any) -> Cluster:
    """Keyword form of `cluster_from_table`, for code and tests."""
    table: dict[str, Any] = {"preset": preset, **overrides}
    if nodes is not None:
        table["nodes"] = nodes
    if fabric is not None:
        table["fabric"] = fabric
    return cluster_from_table(table)


def read_cluster_file(path: str | Path,
                      overrides: Mapping[str, Any] | None = None) -> ClusterSpec:
    """The `[cluster]` table of a TOML file, checked; `overrides` (from flags) win."""
    data = load_toml(path, what="--cluster")
    table = data.get("cluster")
    if not isinstance(table, dict):
        raise ConfigError(f"--cluster: {path} has no [cluster] table")
    return read_cluster({**table, **(overrides or {})})


def load_cluster_file(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Cluster:
    """A TOML file with a `[cluster]` table, built; `overrides` (from flags) win."""
    return read_cluster_file(path, overrides).build()


def cluster_from_table(table: Mapping[str, Any], where: str = "cluster") -> Cluster:
    """Check `table` and build the cluster it describes."""
    return read_cluster(table, where).build()


def read_cluster_table(table: ClusterTable, overrides: Mapping[str, Any] | None = None,
                       where: str = "cluster") -> ClusterSpec:
    """The spec a `ClusterTable` (a trace's `cluster_spec`) describes; `overrides` (from
    flags) win: `--nodes` and `--fabric` resize or rewire the traced cluster."""
    return read_cluster({**table.table(), **(overrides or {})}, where)


def read_cluster(table: object, where: str = "cluster") -> ClusterSpec:
    """Check every key of a `[cluster]` table and its size, building nothing."""
    fields = Fields.of(table, where).known(KEYS)
    spec = dataclasses.replace(_read(fields, where), variability=_variability(fields))
    given = tuple(sorted((key, tuple(value) if isinstance(value, list) else value)
                         for key, value in fields.table.items()
                         if key not in ("preset", "nodes", "fabric")))
    return dataclasses.replace(spec, table=ClusterTable(preset=spec.preset, nodes=spec.nodes,
                                                        fabric=spec.fabric, overrides=given))


def _read(fields: Fields, where: str) -> ClusterSpec:
    name = fields.table.get("preset", "dgx-h100")
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(f"{where}.preset: {show(name)} is not a preset "
                          f"(known: {', '.join(PRESETS)})")
    preset = PRESETS[name]
    fabric = fields.table.get("fabric", preset.fabric)
    if not isinstance(fabric, str) or fabric not in FABRICS:
        raise ConfigError(f"{where}.fabric: {show(fabric)} is not a fabric "
                          f"(known: {', '.join(FABRICS)})")
    if (fabric == "torus") != (preset.fabric == "torus"):
        raise ConfigError(f"{where}.fabric: {fabric!r} does not fit preset {name!r}, "
                          f"whose chips sit on a {preset.fabric}")
    _check_applicable(fields, name, fabric)
    cores = _cores(fields, preset)
    accelerator = _accelerator(preset.accelerator, fields)
    gpus = fields.integer("gpus_per_node", preset.server.gpus, minimum=1,
                          maximum=MAX_GPUS_PER_NODE)
    if fabric == "torus":
        return _torus(preset, fields, accelerator, dataclasses.replace(preset.server, gpus=gpus))
    nodes = fields.integer("nodes", 1, minimum=1, maximum=preset.max_nodes or MAX_ACCELERATORS)
    if preset.max_gpus_per_node:
        gpus = fields.integer("gpus_per_node", gpus, minimum=1,
                              maximum=preset.max_gpus_per_node)
    _check_size(nodes, gpus, where)
    server = _server(preset.server, gpus, fields)
    latency = fields.time("switch_latency", preset.switch_latency_s)
    fat_tree = _fat_tree(preset, fields, server, latency) if fabric == "fat-tree" else None
    sharp = fields.boolean("sharp", False)
    if sharp and not server.nics:  # SHARP reduces in InfiniBand switches: none to reduce in
        raise ConfigError(f"{fields.name('sharp')}: true needs servers whose NICs reach "
                          f"InfiniBand switches; preset {name!r} has no NICs")
    return ClusterSpec(preset=name, fabric=fabric, nodes=nodes, accelerator=accelerator,
                       server=server, switch_latency_s=latency, sharp=sharp, fat_tree=fat_tree,
                       cores=cores)


def _cores(fields: Fields, preset: Preset) -> int:
    """`cores`: the host CPU cores the ranks of a CPU preset (localhost) share."""
    if "cores" in fields and preset.server.link_kind != "loopback":
        raise ConfigError(f"{fields.name('cores')}: applies to the localhost preset only (CPU "
                          f"ranks sharing a host's cores), not to preset {preset.name!r}")
    return fields.integer("cores", 0, minimum=1, maximum=MAX_CORES) if "cores" in fields else 0


def _check_applicable(fields: Fields, preset: str, fabric: str) -> None:
    """A key that the preset's fabric does not use is an error, not silently ignored."""
    unused: tuple[str, ...]
    if fabric == "torus":
        unused = (*SERVER_KEYS, *FAT_TREE_KEYS)
    else:
        unused = TORUS_KEYS if fabric == "fat-tree" else (*FAT_TREE_KEYS, *TORUS_KEYS)
    for key in unused:
        if key in fields:
            scope = ('fabric = "fat-tree"' if key in FAT_TREE_KEYS else
                     "a torus preset" if key in TORUS_KEYS else "a switched (DGX) preset")
            raise ConfigError(f"{fields.name(key)}: applies to {scope} only, not to preset "
                              f"{preset!r} with fabric {fabric!r}")


def _check_size(nodes: int, gpus: int, where: str) -> None:
    if nodes * gpus > MAX_ACCELERATORS:
        raise ConfigError(f"{where}.nodes: {nodes:,} nodes x {gpus} accelerators = "
                          f"{nodes * gpus:,}, more than the {MAX_ACCELERATORS:,} parasim "
                          "simulates")


def _accelerator(base: Accelerator, fields: Fields) -> Accelerator:
    """The preset's accelerator with the table's overrides; `gpu_power` (`topology.power`)
    sets the clock it sustains."""
    if "gpu_power" in fields:
        base = read_gpu_power(fields.table["gpu_power"], base, fields.name("gpu_power"))
    tflops = fields.number("gpu_peak_tflops", base.peak_flops / 1e12, minimum=MIN_TFLOPS,
                           maximum=MAX_TFLOPS, unit=" TFLOP/s")
    return dataclasses.replace(
        base,
        peak_flops=tflops * 1e12,
        memory_bytes=fields.size("gpu_memory", int(base.memory_bytes),
                                 maximum=MAX_MEMORY_BYTES),
        hbm_bandwidth_Bps=fields.bandwidth("hbm_bandwidth", base.hbm_bandwidth_Bps),
    )


def _server(base: ServerSpec, gpus: int, fields: Fields) -> ServerSpec:
    return dataclasses.replace(
        base,
        gpus=gpus,
        nvlink_Bps=fields.bandwidth("nvlink_bandwidth", base.nvlink_Bps),
        nvlink_efficiency=fields.link_efficiency("nvlink_efficiency", base.nvlink_efficiency),
        nvlink_latency_s=fields.time("nvlink_latency", base.nvlink_latency_s),
        nics=fields.integer("nics_per_node", base.nics, minimum=0, maximum=MAX_NICS_PER_NODE),
        nic_Bps=fields.bandwidth("nic_bandwidth", base.nic_Bps),
        nic_efficiency=fields.link_efficiency("nic_efficiency", base.nic_efficiency),
        pcie_Bps=fields.bandwidth("pcie_bandwidth", base.pcie_Bps),
        pcie_latency_s=fields.time("pcie_latency", base.pcie_latency_s),
    )


def _fat_tree(preset: Preset, fields: Fields, server: ServerSpec,
              latency: float) -> FatTreeSpec:
    default_per_leaf = max(1, (preset.switch_radix // 2) // max(server.nics, 1))
    per_leaf = fields.integer("nodes_per_leaf", default_per_leaf, minimum=1,
                              maximum=MAX_ACCELERATORS)
    if per_leaf * server.nics > MAX_LEAF_PORTS:
        raise ConfigError(f"{fields.name('nodes_per_leaf')}: {per_leaf} nodes x {server.nics} "
                          f"NICs = {per_leaf * server.nics:,} ports on one leaf, more than "
                          f"{MAX_LEAF_PORTS:,}")
    return FatTreeSpec(
        nodes_per_leaf=per_leaf,
        oversubscription=fields.number("oversubscription", 1.0, minimum=1.0,
                                       maximum=MAX_OVERSUBSCRIPTION),
        tiers=fields.choice("tiers", 2, (2, 3)),
        leaves_per_pod=fields.integer("leaves_per_pod", 0, minimum=1, maximum=MAX_ACCELERATORS),
        pod_oversubscription=_pod_oversubscription(fields),
        link_latency_s=latency,
        routing=Routing(fields.choice("routing", "dmodk", tuple(r.value for r in Routing))),
        routing_seed=fields.integer("routing_seed", 0, minimum=0, maximum=2**63 - 1),
        qps_per_connection=fields.integer("qps_per_connection", 1, minimum=1,
                                          maximum=MAX_QPS_PER_CONNECTION),
    )


def _pod_oversubscription(fields: Fields) -> float:
    """`pod_oversubscription`: above the pods of a three-tier tree only."""
    ratio = fields.number("pod_oversubscription", 1.0, minimum=1.0,
                          maximum=MAX_OVERSUBSCRIPTION)
    if ratio != 1.0 and fields.choice("tiers", 2, (2, 3)) != 3:
        raise ConfigError(f"{fields.name('pod_oversubscription')}: {ratio:g} needs tiers = 3 "
                          "(it thins the links above the pods of a three-tier fat tree)")
    return ratio


def _variability(fields: Fields) -> Variability:
    """`jitter`, `slow_nodes`, `slow_factor`: bounded, the ideal by default."""
    return Variability(
        jitter=fields.number("jitter", 0.0, minimum=0.0, maximum=MAX_JITTER),
        slow_nodes=fields.number("slow_nodes", 0.0, minimum=0.0, maximum=1.0),
        slow_factor=fields.number("slow_factor", 1.0, minimum=1.0, maximum=MAX_SLOW_FACTOR),
    )


def _torus(preset: Preset, fields: Fields, accelerator: Accelerator,
           server: ServerSpec) -> ClusterSpec:
    dims = fields.integers("dims", preset.torus_dims, lengths=(2, 3), minimum=2,
                           maximum=MAX_ACCELERATORS)
    chips = prod(dims)
    shape = "x".join(map(str, dims))
    if chips > MAX_ACCELERATORS:
        raise ConfigError(f"{fields.name('dims')}: a {shape} torus holds {chips:,} chips, more "
                          f"than the {MAX_ACCELERATORS:,} parasim simulates")
    if chips % server.gpus:
        raise ConfigError(f"{fields.name('dims')}: {list(dims)} holds {chips} chips, not a "
                          f"multiple of the {server.gpus} chips per node")
    nodes = chips // server.gpus
    if "nodes" in fields:
        given = fields.integer("nodes", nodes, minimum=1, maximum=MAX_ACCELERATORS)
        if given != nodes:
            raise ConfigError(f"{fields.name('nodes')}: {given} nodes of {server.gpus} chips do "
                              f"not fill the {shape} torus ({chips} chips)")
    spec = TorusSpec(
        dims=dims,
        link_Bps=fields.bandwidth("link_bandwidth", preset.ici_Bps),
        link_latency_s=fields.time("link_latency", preset.ici_latency_s),
    )
    return ClusterSpec(preset=preset.name, fabric="torus", nodes=nodes, accelerator=accelerator,
                       server=server, torus=spec)


def _check_connected(graph: nx.DiGraph, devices: list[str], where: str = "cluster") -> None:
    reachable = nx.descendants(graph, devices[0]) | {devices[0]}
    for device in devices:
        if device not in reachable:
            _not_connected(device, devices[0], where)


def _not_connected(device: str, first: str, where: str = "cluster") -> None:
    raise ConfigError(f"{where}: {device} is not connected to {first} "
                      "(servers need nics_per_node >= 1 to reach each other)")
