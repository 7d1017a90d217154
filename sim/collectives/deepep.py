"""DeepEP's and HybridEP's dispatch and combine as flows: network once per destination NVLink
domain (a server: `traces.hybridep`), then NVLink.

A dispatch op whose split carries `deepep` (`traces.deepep`) is lowered here instead of as
NCCL's grouped sends: the group's members are placed on their servers
(`Cluster.server_of`), `traces.deepep.deepep_flows` gives every (sender, receiver, bytes) of
the exchange (RDMA to each other node's relay, NVLink forwarding from it, NVLink inside the
source's node), and the flows of one size form one flow set, all in one round: DeepEP
pipelines the RDMA sends and the NVLink forwarding in chunks, so they run at once (DESIGN:
a pipelined algorithm's flows run together). The combine (by_sender, the transpose) moves the
same bytes the other way. Every set waits the latency of the exchange's longest route.
HybridEP inside one NVLink domain takes at least its kernels' measured time
(`sim.collectives.hybridep_rate`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import chain

import numpy as np

from sim.collectives.alltoall import all_to_all_flows, enumerated
from sim.collectives.base import Lowering, hop
from sim.collectives.hybridep_rate import with_sm_floor
from sim.engine.flows import FlowSet
from topology.cluster import Cluster
from topology.links import link_counts, link_index
from traces.alltoallv import AllToAllv
from traces.deepep import deepep_flows

NAME = "deepep"
"""The lowering's name in a timed trace and the report."""


def lower_deepep(cluster: Cluster, group: Sequence[int], split: AllToAllv) -> Lowering:
    """One round: per distinct flow size, the flows carrying it, each as a fraction of the
    op's mean buffer (`split.mean_send_bytes`)."""
    assert split.deepep is not None, "a DeepEP split"
    group = tuple(group)
    whole = all_to_all_flows(cluster, group) or enumerated(cluster, group)
    flows = deepep_flows(split.deepep, group, [cluster.server_of(r) for r in group])
    by_size: dict[float, list[tuple[int, int]]] = {}
    for a, b, size in flows:
        by_size.setdefault(size, []).append((b, a) if split.by_sender else (a, b))
    mean = split.mean_send_bytes
    index = link_index(cluster)
    sets = []
    for size in sorted(by_size):
        if index is None:
            routes = [hop(cluster, a, b) for a, b in by_size[size]]
            counts = Counter(chain.from_iterable(routes))
            made = FlowSet.from_counts(counts, whole.latency_s, cluster.link_capacity)
        else:  # routed all at once by link arithmetic: the same links and counts
            ends = np.asarray(by_size[size], dtype=np.int64)
            links, many = link_counts(index.hop_links(ends[:, 0], ends[:, 1]))
            made = FlowSet.from_arrays(links, many, whole.latency_s, cluster.link_capacity)
        sets.append((made, size / mean))
    return with_sm_floor((tuple(sets),), cluster, group, split)
