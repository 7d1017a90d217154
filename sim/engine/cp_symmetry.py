"""The cp shift under which a cluster is alike: the network half of folding over CP.

`traces.cp_fold` folds CP ranks whose cp coordinates are equal modulo a step; the programs
are alike under every cp shift, the cluster only under some. A shift by s moves each rank by
s·TP places inside its TP·CP block:

- the block inside one server (TP·CP divides the server's GPUs): step 1, every rank stays
  on its server, and its NIC maps onto another NIC of the same server, as the tp shifts
  that folding has always used do;
- the block over whole servers (the server's GPUs divide TP·CP): the least s moving by whole
  servers, s = G / gcd(G, TP), which permutes the block's servers; alike on rails (each rail
  one switch) and on a fat tree whose leaves hold whole blocks (the servers of a leaf are
  alike), with routes that are shifts of each other (`symmetric`: not ECMP's hash);
- otherwise (a block cut mid-server, a torus) none: the fold stays per (cp, pp); and none
  where that shift is 1 across servers (TP a multiple of G: each CP rank on servers of its
  own). There a representative's send and receive, both over the network, meet as one
  transfer that marks it busy once, where the unfolded run has two that end at one instant:
  under the interference model a kernel starting at that instant is stretched or not by
  simpy's order of the two events, and the unfolded run itself differs between CP ranks
  (TP 8 · CP 2 on two DGX H100: rank 0's flash kernels 4e-8 s longer than rank 8's).

TP 2 · CP 8 on DGX H100 (8 GPUs a server): the ring crosses servers between cp 3 and 4 and
between cp 7 and 0, so only the shift by 4 is alike and the fold keeps two cp coordinates.
"""

from __future__ import annotations

import math

from topology.cluster import Cluster
from topology.fabric import FatTree, Rails
from traces.layout import Layout


def cp_fold_step(cluster: Cluster, layout: Layout) -> int:
    """The least cp shift (> 0, < CP) that maps `cluster` onto itself for `layout`'s ranks
    (module docstring); 0 where none does or CP is 1."""
    if layout.cp == 1:
        return 0
    gpus, block = cluster.devices_per_server, layout.tp * layout.cp
    if gpus % block == 0:
        return 1
    if block % gpus:
        return 0
    step = gpus // math.gcd(gpus, layout.tp)
    if step == 1 or step >= layout.cp or not _servers_alike(cluster, block // gpus):
        return 0
    return step


def _servers_alike(cluster: Cluster, servers: int) -> bool:
    """Whether permuting the servers of each aligned run of `servers` maps the fabric onto
    itself: rails, or a fat tree routed by shifts whose leaves hold whole runs."""
    fabric = cluster.fabric
    if isinstance(fabric, Rails):
        return True
    if isinstance(fabric, FatTree):
        return fabric.symmetric and fabric.spec.nodes_per_leaf % servers == 0
    return False


__all__ = ["cp_fold_step"]
