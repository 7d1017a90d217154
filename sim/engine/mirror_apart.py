"""Whether DualPipe's mirrored half of the ranks shares no link with the simulated half.

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


__all__ = ["halves_apart"]
