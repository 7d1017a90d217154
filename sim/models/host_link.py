"""The GPU's link to host memory, per direction, that activation offload copies cross
(`traces.plan.offload`): NVLink-C2C on Grace parts, else the server's PCIe link."""

from __future__ import annotations

from topology.cluster import Cluster
from traces.cpu_offload import host_link_Bps


def cluster_host_Bps(cluster: Cluster) -> float:
    """Per-direction GPU<->host bandwidth of `cluster`: NVLink-C2C on Grace parts
    (`traces.cpu_offload.NVLINK_C2C_BPS`), else its PCIe links' (the preset's `pcie_Bps`,
    e.g. PCIe 5.0 x16 on HGX H100/B200); 0 where it has neither."""
    server = getattr(cluster.fabric, "server", None)  # a torus or a hand-built graph: none
    return host_link_Bps(cluster.accelerator.name, server.pcie_Bps if server else 0.0)
