"""`ClusterTable`: the `[cluster]` table a cluster was built from, as a plain value.

A trace carries it (`traces.header.TraceMeta.cluster_spec`) so that its cluster can be rebuilt
exactly (`topology.config.read_cluster_table`); `topology` imports it from here, a module of
the standard library only, never the workload parts of `traces`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TableValue = str | int | float | bool | tuple[int | float, ...]
"""A value of a `[cluster]` table: TOML scalars and lists of numbers (`dims`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterTable:
    """The `[cluster]` table a cluster was built from, with its preset, node count and fabric
    resolved: `topology.config.read_cluster_table` rebuilds exactly that cluster."""

    preset: str
    nodes: int
    fabric: str
    overrides: tuple[tuple[str, TableValue], ...] = ()
    """The table's other keys as written ("nic_bandwidth" = "400Gb/s"), sorted by key."""

    def table(self) -> dict[str, Any]:
        """The `[cluster]` table: what `topology.config.read_cluster` reads."""
        return {"preset": self.preset, "nodes": self.nodes, "fabric": self.fabric,
                **{k: list(v) if isinstance(v, tuple) else v for k, v in self.overrides}}
