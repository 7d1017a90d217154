"""What gloo runs: the collectives of torch.distributed's gloo backend on CPU tensors.

Processes on one host (`localhost`, links of kind "loopback") talk through gloo, and gloo runs
one algorithm per collective whatever the size (torch 2.13, ProcessGroupGloo.cpp and gloo's
sources):

    all_reduce      gloo::allreduce, a ring: reduce-scatter then all-gather, 2(n-1) steps of
                    S/n each — parasim's ring
    all_gather      gloo::allgather (all_gather_into_tensor -> allgather_coalesced), a ring of
                    n-1 steps of S/n — parasim's ring
    reduce_scatter  reduce_scatter_tensor -> reduce_scatter_tensor_coalesced: an all-reduce of
                    a copy of the whole input, then this rank's chunk copied out. It moves what
                    an all-reduce of S moves, 2(n-1)/n·S per rank in 2(n-1) steps — twice a
                    ring reduce-scatter's bytes and steps

so `auto` on a loopback cluster takes these rather than the fastest lowering by alpha-beta time
(which would pick recursive halving/doubling at 4 ranks, and a reduce-scatter at half gloo's
cost). Other collectives (broadcast, all-to-all) are left to `auto`'s usual choice.

Each call also costs the link class's `call_s` once, before the ring's first message: gloo
queues a collective to its worker thread and the caller is woken when the work is done — on a
small host two thread hand-offs, ~0.3 ms each call on the 2-vCPU VM this was measured on (a
send or receive is not queued and pays none). It is added to the first round's latency;
`parasim calibrate` fits it beside the link's latency and bandwidth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sim.collectives.base import AG, AR, RS, Lowering
from sim.collectives.ring import lower_ring
from topology.cluster import Cluster
from topology.override import call_cost
from traces.ops import OpKind

GLOO_LINK_KIND = "loopback"


def runs_gloo(cluster: Cluster) -> bool:
    """Whether the cluster's ranks are processes on one host talking gloo (localhost)."""
    return GLOO_LINK_KIND in cluster.link_kind


def lower_gloo(cluster: Cluster, kind: OpKind, group: Sequence[int],
               channels: int | None = None) -> Lowering | None:
    if not runs_gloo(cluster) or len(group) < 2 or kind not in (AR, AG, RS):
        return None
    ring = lower_ring(cluster, AR if kind is RS else kind, group, channels)
    assert ring is not None, "a ring runs every all-reduce and all-gather"
    first, *rest = ring
    call = call_cost(cluster, (link for flows, _ in first for link in flows.links))
    if call == 0:
        return ring
    started = tuple((dataclasses.replace(flows, latency_s=flows.latency_s + call), factor)
                    for flows, factor in first)
    return (started, *rest)
