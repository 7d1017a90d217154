"""Where a rank's peers sit on a fat tree, relative to it: the network part of its identity.

The uniform fold (one rank per (cp, pp)) lets each representative's flows stand for its copies'.
On a fat tree that holds while every rank of a class sees its peers at the same distances;
it fails where the layout's blocks cut across leaves unevenly. Six DGX nodes on leaves of four,
pipeline stages of three nodes: stage 0's node 0 sends to node 3 on its own leaf, nodes 1 and 2
send to nodes 4 and 5 across a spine, and the fold that simulates node 0 alone predicted the
step 0.06% fast. So a rank's position is the distance to its pipeline neighbours and how many
members of each of its groups share its node, leaf and pod (`traces.identity` refines by it);
where every class sits alike, nothing changes.

Expert groups are placed on any fabric: an NVLink domain (a server) that cuts an EP group
unevenly (EP 16 on 72-GPU GB200 NVL72 racks: ranks 64-79 are 8 + 8) sends part of that group's
all-to-all over the network while the groups it holds whole stay on NVLink, and the uniform fold
that simulated rank 0's group alone predicted the step 2-10% fast.

Distances are the fabric's tiers (0 same server, 1 same leaf, 2 same pod, 3 across the core).
Computed with array arithmetic per group kind, O(world), never per member.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from topology.cluster import Cluster
from topology.fabric import FatTree
from traces.layout import Layout


def network_positions(cluster: Cluster, layout: Layout) -> Sequence[Hashable] | None:
    """Per rank, its position on `cluster` relative to its groups' members; None where every
    (cp, pp) class sits alike, so the uniform fold stands. On a fat tree of several leaves:
    every group's sharing of server, leaf and pod and the pipeline neighbours' tiers; on any
    fabric, the expert groups' sharing of a server (an EP group that one NVLink domain cuts
    unevenly sends more of its all-to-all over the network than one it holds whole)."""
    fabric = cluster.fabric
    fat = isinstance(fabric, FatTree) and fabric.num_leaves > 1
    if not fat and layout.ep * layout.etp == 1:
        return None  # rails and a torus are the same seen from every server
    rank = np.arange(layout.world, dtype=np.int64)
    node = rank // cluster.devices_per_server
    columns = []
    if isinstance(fabric, FatTree) and fat:
        leaf = node // fabric.spec.nodes_per_leaf
        places: tuple[np.ndarray, ...] = (node, leaf, leaf // fabric.per_pod)
        columns += _dense_columns(layout, rank, places)
    else:
        places = (node,)
    for group in _expert_groups(layout, rank):
        columns += [_sharing(group, place) for place in places]
    table = np.stack(columns, axis=1)
    rest = rank // layout.tp
    cp, pp = rest % layout.cp, rest // (layout.cp * layout.dp)
    if _alike(table, cp + layout.cp * pp):
        return None
    return [tuple(row) for row in table.tolist()]


def _dense_columns(layout: Layout, rank: np.ndarray,
                   places: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    """TP, CP and DP x CP groups' sharing of each place, and the pipeline neighbours' tiers."""
    tp, rest = rank % layout.tp, rank // layout.tp
    cp, rest = rest % layout.cp, rest // layout.cp
    dp, pp = rest % layout.dp, rest // layout.dp
    columns = []
    for group in (cp + layout.cp * (dp + layout.dp * pp),  # TP groups, by what they share
                  tp + layout.tp * (dp + layout.dp * pp),  # CP
                  tp + layout.tp * pp):                     # DP x CP
        columns += [_sharing(group, place) for place in places]
    for step in (1, -1):  # the pipeline's next and previous stage (wrapping: the embeddings')
        peer = rank + ((pp + step) % layout.pp - pp) * (layout.tp * layout.cp * layout.dp)
        columns.append(_tier(places, peer))
    return columns


def _expert_groups(layout: Layout, rank: np.ndarray) -> list[np.ndarray]:
    """Per rank, its EP, ETP and expert-DP group, each named by its least member (the ranks of
    the stage that differ only in that coordinate: `traces.expert_grid`); none without experts
    parallel."""
    if layout.ep * layout.etp == 1:
        return []
    index = rank % (layout.tp * layout.cp * layout.dp)
    edp = layout.tp * layout.cp * layout.dp // (layout.etp * layout.ep)
    return [rank - ((index // stride) % count) * stride
            for stride, count in ((layout.etp, layout.ep), (1, layout.etp),
                                  (layout.etp * layout.ep, edp))]


def _sharing(group: np.ndarray, place: np.ndarray) -> np.ndarray:
    """Per rank, how many members of its group share its `place` (server, leaf or pod)."""
    pairs = group * (int(place.max()) + 1) + place
    _, index, counts = np.unique(pairs, return_inverse=True, return_counts=True)
    return counts[index]


def _tier(places: tuple[np.ndarray, ...], peer: np.ndarray) -> np.ndarray:
    """Per rank, the fabric tier between it and `peer`: 0 one server ... 3 across the core."""
    tier = np.full(len(peer), 3, dtype=np.int64)
    for level in reversed(range(len(places))):
        tier[places[level] == places[level][peer]] = level
    return tier


def _alike(table: np.ndarray, cls: np.ndarray) -> bool:
    """Every class (by `cls`) has one row of `table` for all its ranks."""
    order = np.argsort(cls, kind="stable")
    rows, classes = table[order], cls[order]
    same_class = classes[1:] == classes[:-1]
    return bool(np.all((rows[1:] == rows[:-1]).all(axis=1) | ~same_class))


__all__ = ["network_positions"]
