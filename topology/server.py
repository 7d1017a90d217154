"""One server: n GPUs on an NVSwitch, each GPU wired over PCIe to its nearest NIC.

NVSwitch is modelled as one non-blocking switch (the several NVSwitch chips of a DGX act as one
crossbar); a GPU's NVLink bandwidth is the sum of its links, per direction.
"""

from __future__ import annotations

from dataclasses import dataclass

from topology.builder import GraphBuilder


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSpec:
    """What one server holds and how fast its internal links are."""

    gpus: int
    nvlink_Bps: float
    """NVLink line rate per GPU, per direction (all of its links together)."""
    nvlink_efficiency: float = 1.0
    """Fraction of the line rate that carries data (NVLink protocol overhead)."""
    nvlink_latency_s: float
    """Latency of one link GPU<->NVSwitch; a GPU-to-GPU hop crosses two."""
    nics: int
    nic_Bps: float
    """Network port line rate per NIC, per direction."""
    nic_efficiency: float = 1.0
    """Fraction of the port's line rate that carries data."""
    pcie_Bps: float
    """GPU<->NIC PCIe bandwidth per direction."""
    pcie_latency_s: float
    """GPU<->NIC latency, NIC processing included."""
    link_kind: str = "nvlink"
    """The `kind` of the accelerator<->switch links inside the server ("loopback" for
    processes on one host): what a profile's measured link figures replace."""

    def nic_of(self, gpu: int) -> int:
        """The NIC closest to local GPU `gpu` (GPUs share NICs evenly when there are fewer)."""
        return gpu * self.nics // self.gpus

    def owner_of(self, nic: int, prefer: int) -> int:
        """A local GPU wired to NIC `nic`: `prefer` itself when it is, else the first that is."""
        if self.nic_of(prefer) == nic:
            return prefer
        return next(g for g in range(self.gpus) if self.nic_of(g) == nic)


def gpu_node(server: int, gpu: int) -> str:
    return f"n{server}.gpu{gpu}"


def nic_node(server: int, nic: int) -> str:
    return f"n{server}.nic{nic}"


def nvswitch_node(server: int) -> str:
    return f"n{server}.nvswitch"


def add_server(builder: GraphBuilder, server: int, spec: ServerSpec) -> list[str]:
    """Add one server's GPUs, NVSwitch and NICs; return the GPU node names in local order."""
    gpus = [
        builder.node(gpu_node(server, i), "gpu", server=server, local=i)
        for i in range(spec.gpus)
    ]
    if spec.gpus > 1:
        switch = builder.node(nvswitch_node(server), "nvswitch", server=server)
        for gpu in gpus:
            builder.link(gpu, switch, bandwidth=spec.nvlink_Bps * spec.nvlink_efficiency,
                         latency=spec.nvlink_latency_s, kind=spec.link_kind)
    for j in range(spec.nics):
        builder.node(nic_node(server, j), "nic", server=server, local=j)
    for i, gpu in enumerate(gpus):
        if spec.nics:
            builder.link(gpu, nic_node(server, spec.nic_of(i)), bandwidth=spec.pcie_Bps,
                         latency=spec.pcie_latency_s, kind="pcie")
    return gpus


def intra_server_path(spec: ServerSpec, server: int, a: int, b: int) -> list[str]:
    """GPU a to GPU b of the same server: through the NVSwitch (empty when a == b)."""
    if a == b:
        return [gpu_node(server, a)]
    return [gpu_node(server, a), nvswitch_node(server), gpu_node(server, b)]
