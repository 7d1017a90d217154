"""NVLink SHARP (NVLS): the NVSwitch reduces and multicasts, inside one Hopper server.

Each GPU pushes its buffer up to the switch, which reduces it across the GPUs, and pulls the
reduced result down: for an all-reduce every GPU's link carries (1 + 1/n) x S per direction
(its share up once more for the multicast, every other share down; nccl#2140). The flows are
the up and down links of the group's GPUs, once each (a ring of hops through the switch
crosses each GPU's two links exactly once). Not selectable by name: NCCL picks it
(`sim.collectives.nccl`), and its bytes are not a ring's, so ring bus-bandwidth bounds do not
apply to it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.collectives.base import AG, AR, RS, Lowering, flowset, hop
from sim.collectives.nccl_plan import gpu_bytes_per_payload
from sim.collectives.nccl_system import compute_capability
from sim.collectives.protocols import Algo
from topology.cluster import Cluster
from traces.errors import ConfigError
from traces.ops import OpKind


def lower_nvls(cluster: Cluster, kind: OpKind, group: Sequence[int],
               channels: int | None = None) -> Lowering | None:
    """NVLS inside one NVSwitch server of Hopper GPUs; None elsewhere."""
    server = getattr(cluster.fabric, "server", None)
    if kind not in (AR, RS, AG) or len(group) < 2 or server is None or not server.nvlink_Bps:
        return None
    if len({cluster.server_of(r) for r in group}) != 1:
        return None
    try:
        if compute_capability(cluster.accelerator.name) < 90:
            return None
    except ConfigError:
        return None
    n = len(group)
    routes = [hop(cluster, group[i], group[(i + 1) % n]) for i in range(n)]
    up_and_down = cluster.path_latency(routes[0])  # GPU -> NVSwitch -> GPU
    factor = gpu_bytes_per_payload(kind, Algo.NVLS, n)
    return (((flowset(cluster, routes, up_and_down), factor),),)
