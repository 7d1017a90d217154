"""Double binary tree all-reduce, as NCCL runs it across servers.

Between servers, two binary trees each reduce (up) and broadcast (down) half of the data, all
flows pipelined at once; tree 2 mirrors tree 1 (or shifts it, for an odd count) so that a
server is interior in at most one of them. Inside a server the members form a chain. Each
channel does this over its own NIC with 1/channels of the data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sim.collectives.base import (
    AR,
    Lowering,
    by_server,
    default_channels,
    hops_flowset,
    rotated,
    uniform,
)
from topology.cluster import Cluster
from traces.ops import OpKind


def inorder_parent(j: int, n: int) -> int | None:
    """Parent of node j (1-based) in the in-order binary tree over 1..n, or None for the root.

    Node j's height is its number of trailing zero bits. A parent beyond n does not exist, and
    its place is taken by the child that would have hung under it.
    """
    height = (j & -j).bit_length() - 1
    while True:
        step = 1 << height
        up = j + step if (j >> (height + 1)) & 1 == 0 else j - step
        if up < 1 or (up > n and up - 2 * step < 1):
            return None
        if up <= n:
            return up
        j, height = up, height + 1


def tree_edges(n: int, mirror: bool) -> list[tuple[int, int]]:
    """(parent, child) edges over positions 0..n-1; `mirror` gives the complementary tree."""
    def position(i: int) -> int:
        if not mirror:
            return i
        return n - 1 - i if n % 2 == 0 else (i + 1) % n

    edges = []
    for i in range(n):
        parent = inorder_parent(i + 1, n)
        if parent is not None:
            edges.append((position(parent - 1), position(i)))
    return edges


def tree_depth(edges: list[tuple[int, int]]) -> int:
    parent = {child: p for p, child in edges}
    depth = 0
    for node in parent:
        d = 0
        while node in parent:
            node, d = parent[node], d + 1
        depth = max(depth, d)
    return depth


def lower_tree(cluster: Cluster, kind: OpKind, group: Sequence[int],
               channels: int | None = None) -> Lowering | None:
    if kind is not AR or len(group) < 2:
        return None
    servers = by_server(cluster, group)
    channels = channels or default_channels(cluster, servers)
    trees = [tree_edges(len(servers), mirror=False), tree_edges(len(servers), mirror=True)]
    depth = max(tree_depth(e) for e in trees)
    edges = np.array([e for t in trees for e in t], dtype=np.int64).reshape(-1, 2)
    rnd = []  # one round: both trees of every channel at once
    for c in range(channels):
        chains = rotated(servers, c) if uniform(servers) else servers
        heads = np.array([chain[0] for chain in chains], dtype=np.int64)
        parents, children = heads[edges[:, 0]], heads[edges[:, 1]]
        links = [(a, b) for chain in chains for a, b in zip(chain, chain[1:])]
        chain_len = max(len(ch) for ch in chains) - 1

        def latency(lats: list[list[float]], chain_len: int = chain_len) -> float:
            lat_inter = max(lats[0], default=0.0)
            lat_intra = max(lats[1], default=0.0)
            return 2 * (depth * lat_inter + chain_len * lat_intra)  # up the tree, then down

        # each tree runs the same chains inside the servers
        flows = hops_flowset(cluster, [
            (np.concatenate([children, parents]), np.concatenate([parents, children]), 1),
            ([b for a, b in links] + [a for a, b in links],
             [a for a, b in links] + [b for a, b in links], len(trees))], latency)
        rnd.append((flows, 0.5 / channels))
    return (tuple(rnd),)
