"""Build a `Cluster` from a preset and per-field overrides, as written in `[cluster]` of a TOML.

    [cluster]
    preset = "dgx-h100"      # a key of topology.presets.PRESETS
    nodes = 16
    fabric = "rail"          # fat-tree | rail | torus
    nic_bandwidth = "400Gb/s"

Every bad value raises `ConfigError` naming the field, the value and the rule.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from topology.builder import GraphBuilder
from topology.cluster import Accelerator, Cluster
from topology.fabric import FatTree, FatTreeSpec, Rails
from topology.presets import PRESETS, Preset
from topology.server import ServerSpec, add_server
from topology.torus import Torus, TorusSpec
from traces.errors import ConfigError, check_keys
from traces.units import parse_bandwidth, parse_size, parse_time

FABRICS = ("fat-tree", "rail", "torus")

# key -> what it overrides; the order is the order of the error message's list.
OVERRIDES = (
    "gpus_per_node", "nvlink_bandwidth", "nvlink_efficiency", "nvlink_latency", "nics_per_node",
    "nic_bandwidth", "nic_efficiency",
    "pcie_bandwidth", "pcie_latency", "switch_latency", "nodes_per_leaf", "oversubscription",
    "tiers", "leaves_per_pod", "dims", "link_bandwidth", "link_latency", "gpu_peak_tflops",
    "gpu_memory", "hbm_bandwidth",
)
KEYS = ("preset", "nodes", "fabric", *OVERRIDES)


def build_cluster(preset: str = "dgx-h100", *, nodes: int | None = None,
                  fabric: str | None = None, **overrides: Any) -> Cluster:
    """Keyword form of `cluster_from_table`, for code and tests."""
    table: dict[str, Any] = {"preset": preset, **overrides}
    if nodes is not None:
        table["nodes"] = nodes
    if fabric is not None:
        table["fabric"] = fabric
    return cluster_from_table(table)


def load_cluster_file(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Cluster:
    """A TOML file with a `[cluster]` table; `overrides` (from flags) win over the file."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"--cluster: cannot read {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--cluster: {path} is not valid TOML: {err}") from None
    table = data.get("cluster")
    if not isinstance(table, dict):
        raise ConfigError(f"--cluster: {path} has no [cluster] table")
    return cluster_from_table({**table, **(overrides or {})})


def cluster_from_table(table: Mapping[str, Any], where: str = "cluster") -> Cluster:
    """Validate `table` and build the cluster it describes."""
    fields = _Fields(table, where)
    check_keys(table, KEYS, where)
    name = fields.get("preset", "dgx-h100")
    if name not in PRESETS:
        raise ConfigError(f"{where}.preset: {name!r} is not a preset (known: {', '.join(PRESETS)})")
    preset = PRESETS[name]
    fabric = fields.get("fabric", preset.fabric)
    if fabric not in FABRICS:
        raise ConfigError(f"{where}.fabric: {fabric!r} is not a fabric "
                          f"(known: {', '.join(FABRICS)})")
    if (fabric == "torus") != (preset.fabric == "torus"):
        raise ConfigError(f"{where}.fabric: {fabric!r} does not fit preset {name!r}, "
                          f"whose chips sit on a {preset.fabric}")
    accelerator = _accelerator(preset.accelerator, fields)
    server = _server(preset, fields)
    builder = GraphBuilder()
    if fabric == "torus":
        devices, fabric_obj = _torus(preset, fields, server, builder)
    else:
        nodes = fields.integer("nodes", 1, minimum=1)
        devices = [gpu for s in range(nodes) for gpu in add_server(builder, s, server)]
        fabric_obj = _switched(preset, fields, server, fabric, nodes)
        fabric_obj.build(builder, nodes, server.nic_Bps * server.nic_efficiency)
    _check_connected(builder.graph, devices, where)
    return Cluster(
        name=f"{name} x{len(devices) // server.gpus} {fabric}",
        graph=builder.graph,
        devices=tuple(devices),
        accelerator=accelerator,
        devices_per_server=server.gpus,
        fabric=fabric_obj,
    )


def _accelerator(base: Accelerator, fields: _Fields) -> Accelerator:
    return dataclasses.replace(
        base,
        peak_flops=fields.positive("gpu_peak_tflops", base.peak_flops / 1e12) * 1e12,
        memory_bytes=fields.size("gpu_memory", base.memory_bytes),
        hbm_bandwidth_Bps=fields.bandwidth("hbm_bandwidth", base.hbm_bandwidth_Bps),
    )


def _server(preset: Preset, fields: _Fields) -> ServerSpec:
    base = preset.server
    if preset.fabric == "torus":
        return dataclasses.replace(base, gpus=fields.integer("gpus_per_node", base.gpus, minimum=1))
    return ServerSpec(
        gpus=fields.integer("gpus_per_node", base.gpus, minimum=1),
        nvlink_Bps=fields.bandwidth("nvlink_bandwidth", base.nvlink_Bps),
        nvlink_efficiency=fields.fraction("nvlink_efficiency", base.nvlink_efficiency),
        nvlink_latency_s=fields.time("nvlink_latency", base.nvlink_latency_s),
        nics=fields.integer("nics_per_node", base.nics, minimum=0),
        nic_Bps=fields.bandwidth("nic_bandwidth", base.nic_Bps),
        nic_efficiency=fields.fraction("nic_efficiency", base.nic_efficiency),
        pcie_Bps=fields.bandwidth("pcie_bandwidth", base.pcie_Bps),
        pcie_latency_s=fields.time("pcie_latency", base.pcie_latency_s),
    )


def _switched(preset: Preset, fields: _Fields, server: ServerSpec, fabric: str,
              nodes: int) -> FatTree | Rails:
    latency = fields.time("switch_latency", preset.switch_latency_s)
    if fabric == "rail":
        return Rails(server, latency)
    default_per_leaf = max(1, (preset.switch_radix // 2) // max(server.nics, 1))
    spec = FatTreeSpec(
        nodes_per_leaf=fields.integer("nodes_per_leaf", default_per_leaf, minimum=1),
        oversubscription=fields.positive("oversubscription", 1.0, minimum=1.0),
        tiers=fields.choice("tiers", 2, (2, 3)),
        leaves_per_pod=fields.integer("leaves_per_pod", 0, minimum=1),
        link_latency_s=latency,
    )
    return FatTree(server, spec, nodes)


def _torus(preset: Preset, fields: _Fields, server: ServerSpec,
           builder: GraphBuilder) -> tuple[list[str], Torus]:
    dims = fields.get("dims", list(preset.torus_dims))
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                             for d in dims):
        raise ConfigError(f"{fields.where}.dims: {dims!r} must be a list of 2 or 3 integers")
    torus = Torus(TorusSpec(
        dims=tuple(dims),
        link_Bps=fields.bandwidth("link_bandwidth", preset.ici_Bps),
        link_latency_s=fields.time("link_latency", preset.ici_latency_s),
    ))
    if torus.num_chips % server.gpus:
        raise ConfigError(f"{fields.where}.dims: {dims} holds {torus.num_chips} chips, not a "
                          f"multiple of the {server.gpus} chips per node")
    if "nodes" in fields.table:
        nodes = fields.integer("nodes", 1, minimum=1)
        if nodes * server.gpus != torus.num_chips:
            shape = "x".join(map(str, dims))
            raise ConfigError(f"{fields.where}.nodes: {nodes} nodes of {server.gpus} chips do not "
                              f"fill the {shape} torus ({torus.num_chips} chips)")
    return torus.build(builder), torus


def _check_connected(graph: nx.DiGraph, devices: list[str], where: str) -> None:
    reachable = nx.descendants(graph, devices[0]) | {devices[0]}
    for device in devices:
        if device not in reachable:
            raise ConfigError(f"{where}: {device} is not connected to {devices[0]} "
                              "(servers need nics_per_node >= 1 to reach each other)")


@dataclasses.dataclass(frozen=True, slots=True)
class _Fields:
    """Typed, validated reads of one TOML table."""

    table: Mapping[str, Any]
    where: str

    def get(self, key: str, default: Any) -> Any:
        return self.table.get(key, default)

    def _bad(self, key: str, rule: str) -> ConfigError:
        return ConfigError(f"{self.where}.{key}: {self.table[key]!r} {rule}")

    def integer(self, key: str, default: int, *, minimum: int) -> int:
        if key not in self.table:
            return default
        value = self.table[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._bad(key, "must be an integer")
        if value < minimum:
            raise self._bad(key, f"must be at least {minimum}")
        return value

    def positive(self, key: str, default: float, *, minimum: float = 0.0) -> float:
        if key not in self.table:
            return default
        value = self.table[key]
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._bad(key, "must be a number")
        if not value > 0 or value < minimum:
            raise self._bad(key, f"must be a number >= {minimum:g} and > 0")
        return float(value)

    def fraction(self, key: str, default: float) -> float:
        if key not in self.table:
            return default
        value = self.table[key]
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 1:
            raise self._bad(key, "must be a fraction in (0, 1]")
        return float(value)

    def choice(self, key: str, default: Any, options: tuple[Any, ...]) -> Any:
        value = self.table.get(key, default)
        if value not in options or isinstance(value, bool):
            raise self._bad(key, f"must be one of {', '.join(map(str, options))}")
        return value

    def bandwidth(self, key: str, default: float) -> float:
        if key not in self.table:
            return default
        return parse_bandwidth(self.table[key], f"{self.where}.{key}")

    def time(self, key: str, default: float) -> float:
        if key not in self.table:
            return default
        return parse_time(self.table[key], f"{self.where}.{key}")

    def size(self, key: str, default: float) -> float:
        if key not in self.table:
            return default
        return float(parse_size(self.table[key], f"{self.where}.{key}"))
