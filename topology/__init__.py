"""The hardware as a graph: servers of GPUs on NVSwitch, NICs, switched fabrics and tori.

`build_cluster(preset, nodes=..., fabric=...)` and `load_cluster(toml_table)` return a
`Cluster`: a `networkx.DiGraph` whose directed links carry `bandwidth` (bytes/s), `latency`
(s), `kind` and a dense integer `id`, plus deterministic, cached routing between accelerators.
"""

from topology.cluster import Accelerator, Cluster
from topology.config import build_cluster, cluster_from_table
from topology.presets import PRESETS

__all__ = ["Accelerator", "Cluster", "PRESETS", "build_cluster", "cluster_from_table"]
