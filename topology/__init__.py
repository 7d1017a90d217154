"""The hardware as a graph: servers of GPUs on NVSwitch, NICs, switched fabrics and tori.

`build_cluster(preset, nodes=..., fabric=...)` and `cluster_from_table(table)` (a `[cluster]`
TOML table) return a `Cluster`: a `networkx.DiGraph` whose directed links carry `bandwidth`
(bytes/s), `latency` (s), `kind` and a dense integer `id`, plus deterministic, cached routing
between accelerators. `read_cluster(table)` checks a table and tells its size without building.
"""

from topology.cluster import Accelerator, Cluster
from topology.config import ClusterSpec, build_cluster, cluster_from_table, read_cluster
from topology.presets import PRESETS

__all__ = ["Accelerator", "Cluster", "ClusterSpec", "PRESETS", "build_cluster",
           "cluster_from_table", "read_cluster"]
