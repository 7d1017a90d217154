"""Where DualPipe's mirror fold may stand for the cluster: the swap alike, the halves apart.

`mirror_alike`: reversing the pipeline stages' blocks maps the cluster onto itself (the fold's
precondition). `halves_apart`: the mirrored half shares no link with the simulated half.

Folded by mirrors (`traces.mirror_fold`), the absent half's collectives would be added as copies
where their flows cross links the simulated half uses. On rails or a fat tree every link belongs
to one server (its NVLink, its NICs to the rail or leaf), one leaf (its links to the spines) or
one pod (its links to the core), so a collective among the mirrored half's ranks can share a link
with the simulated half only where the halves share a server, a leaf or a pod: where they share
none, its copies need not be lowered at all (a DeepSeek-V3 stage's EP all-to-all over 8 servers
costs a lowering per copy).
"""

from __future__ import annotations

from topology.cluster import Cluster
from topology.fabric import FatTree, Rails
from traces.layout import Layout


def halves_apart(cluster: Cluster, layout: Layout) -> bool:
    """Whether the ranks with pp < pp/2 and those with pp >= pp/2 sit on disjoint servers and,
    on a fat tree, disjoint leaves and pods (the halves are contiguous: pp is outermost)."""
    fabric, gpus = cluster.fabric, cluster.devices_per_server
    cut = layout.world // 2  # the first mirrored rank
    last = cut - 1
    if cut % gpus:
        return False
    if isinstance(fabric, Rails):
        return True
    if not isinstance(fabric, FatTree):
        return False
    leaf = fabric.spec.nodes_per_leaf
    pod = leaf * fabric.per_pod
    return last // gpus // leaf != cut // gpus // leaf and \
        (fabric.per_pod >= fabric.num_leaves or last // gpus // pod != cut // gpus // pod)


def mirror_alike(cluster: Cluster, layout: Layout) -> bool:
    """Whether reversing the order of the pipeline stages' blocks of ranks (pp outermost, a
    block of TP·CP·DP ranks each) maps the cluster onto itself: the whole job in one server;
    several whole blocks a server, holding whole NICs, servers permuted; or whole servers a
    block; on rails, or on a fat tree routed by shifts whose leaves and pods the reversal
    permutes (`_aligned`). Other fabrics (a torus) and ECMP's hashed routes: no."""
    gpus, block = cluster.devices_per_server, layout.tp * layout.cp * layout.dp
    if layout.world <= gpus:
        return True
    fabric = cluster.fabric
    if not isinstance(fabric, Rails | FatTree) or not fabric.symmetric:
        return False
    if gpus % block == 0:
        per, nics = gpus // block, fabric.server.nics
        if layout.pp % per or gpus % nics or block % (gpus // nics):
            return False
        servers, units = 1, layout.pp // per
    elif block % gpus == 0:
        servers, units = block // gpus, layout.pp
    else:
        return False
    if isinstance(fabric, Rails):
        return True
    leaf = fabric.spec.nodes_per_leaf
    return _aligned(servers, units, leaf) and _aligned(servers, units, leaf * fabric.per_pod)


def _aligned(servers: int, units: int, size: int) -> bool:
    """Whether reversing `units` runs of `servers` servers maps the aligned runs of `size`
    servers (a leaf's, a pod's) onto each other: all in one, each unit whole runs, or each
    run whole units and the units fill whole runs."""
    total = servers * units
    return total <= size or servers % size == 0 or (size % servers == 0 and total % size == 0)


__all__ = ["halves_apart", "mirror_alike"]
