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
- the block over whole leaves of a fat tree routed by destination-mod-k (below): the least s
  moving by whole leaves, s = L / gcd(L, TP) for L = nodes_per_leaf · G GPUs a leaf;
- otherwise (a block cut mid-server, a torus) none: the fold stays per (cp, pp); and none
  where that shift is 1 across servers (TP a multiple of G: each CP rank on servers of its
  own; likewise TP a multiple of L). There a representative's send and receive, both over
  the network, meet as one transfer that marks it busy once, where the unfolded run has two
  that end at one instant: under the interference model a kernel starting at that instant is
  stretched or not by simpy's order of the two events, and the unfolded run itself differs
  between CP ranks (TP 8 · CP 2 on two DGX H100: rank 0's flash kernels 4e-8 s longer than
  rank 8's).

TP 2 · CP 8 on DGX H100 (8 GPUs a server): the ring crosses servers between cp 3 and 4 and
between cp 7 and 0, so only the shift by 4 is alike and the fold keeps two cp coordinates.
TP 4 · CP 16 on the dgx-h100 fat tree (4 servers, 32 GPUs a leaf; the MoE Parallel Folding
paper's Table 5 128K row): the block is 8 servers over 2 leaves, so the shift by 2 (one server)
moves a server across the leaf's edge; the shift by 8 (one leaf) is alike and the fold keeps 8.

Why a shift by whole leaves maps a destination-mod-k fat tree onto itself (`topology.fabric.
FatTree`). Let a server hold n NICs, a leaf P servers (D = P·n down-ports, U uplinks), the
TP·CP blocks R servers each (R a multiple of P, so blocks are aligned runs of R/P whole
leaves), and the shift move S servers (S a multiple of P). It sends server q·R + x to
π(q·R + x) = q·R + (x + S) mod R, every block alike, and global NIC g = s·n + j (NIC j of
server s) to π(s)·n + j. `FatTree._leaf(g) = g // D`, so NIC π(g)'s leaf is λ(leaf(g)), λ the
rotation of each block's leaves by S/P: the NIC-to-leaf links map onto NIC-to-leaf links.
A flow between GPUs picks its NICs by their indices inside their servers (`nics_for`, the
same after π) and crosses its servers' NVSwitches as any server's (`intra_server_path`);
between NICs, `FatTree.nic_path` takes:
- the same leaf: [a, leaf, b] -> [π a, λ leaf, π b], the flow's image;
- two leaves: [a, leaf_a, spine u, leaf_b, b] with u = g_b mod U (destination-mod-k).
  π(g_b) = g_b + S·n, less R·n where the rotation wraps, so u is kept when U divides S·n and
  R·n (checked: with oversubscription 1, U = D and both are multiples of D). Every leaf
  reaches every spine by a link alike, so the image path is the image flow's path;
- three tiers: an aggregation switch agg{pod}.u in place of the spine, and across pods
  core{u}.c with c = (g_b // U) mod C (`core_of`, C cores a plane). When a pod holds whole
  blocks (leaves_per_pod a multiple of R/P) π keeps each server's pod, so the same-pod test
  and the aggs are kept, and c moves by S·n/U, less R·n/U where it wraps: by one constant
  (a rotation of the plane's cores, which link to every pod's agg alike) when C divides R·n/U
  (checked; one pod needs none of this).
So π with λ (and the core rotation) is an automorphism of the graph mapping every flow's path
onto its image flow's path: the link loads of the shifted step are the step's, permuted, and
the shifted ranks run identical steps. ECMP (a hash of the NICs' numbers) and adaptive routing
(by the loads placed so far, in placement order) are not shifts of each other: refused. No
shift by part of a leaf maps the tree onto itself where a block crosses a leaf: it moves a
server sharing a leaf with the block's first onto one across a spine from the image of that
first (a one-leaf route onto a spine route).
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
    if step == 1:
        return 0
    if step < layout.cp and _servers_alike(cluster, block // gpus):
        return step
    return _leaf_step(cluster, layout)


def _servers_alike(cluster: Cluster, servers: int) -> bool:
    """Whether permuting the servers of each aligned run of `servers` maps the fabric onto
    itself: rails, or a fat tree routed by shifts whose leaves hold whole runs."""
    fabric = cluster.fabric
    if isinstance(fabric, Rails):
        return True
    if isinstance(fabric, FatTree):
        return fabric.symmetric and fabric.spec.nodes_per_leaf % servers == 0
    return False


def _leaf_step(cluster: Cluster, layout: Layout) -> int:
    """The least cp shift moving each TP·CP block's ranks by whole leaves of a fat tree
    routed by destination-mod-k, where the rotation of the block's leaves maps the tree onto
    itself (module docstring); 0 where it does not or that shift is 1 or CP."""
    fabric = cluster.fabric
    if not isinstance(fabric, FatTree) or not fabric.symmetric:
        return 0
    gpus, block = cluster.devices_per_server, layout.tp * layout.cp
    leaf = fabric.spec.nodes_per_leaf * gpus
    if block % leaf:
        return 0
    step = leaf // math.gcd(leaf, layout.tp)
    if step == 1 or step >= layout.cp:
        return 0
    nics = fabric.server.nics
    moved, span = step * layout.tp // gpus * nics, block // gpus * nics  # NICs
    if moved % fabric.up or span % fabric.up:
        return 0  # the destination-mod-k uplink would change under the shift
    if fabric.per_pod < fabric.num_leaves and (fabric.per_pod % (block // leaf)
                                               or span // fabric.up % fabric.cores):
        return 0  # a block across pods, or cores not rotated by one constant
    return step


__all__ = ["cp_fold_step"]
