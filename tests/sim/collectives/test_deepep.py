"""DeepEP's lowering: each link carries the bytes of the flows `traces.deepep` lists, the
combine the same the other way, and no NCCL choice is taken for it."""

from __future__ import annotations

from collections import Counter

import pytest

from sim.collectives import Collectives
from sim.collectives.base import hop
from sim.collectives.deepep import lower_deepep
from topology.config import build_cluster
from traces.alltoallv import deepep_split
from traces.deepep import deepep_flows
from traces.model import ModelSpec
from traces.moe_spec import expert_counts
from traces.ops import OpKind

M = ModelSpec(layers=4, hidden=1024, heads=4, seq_len=1024, vocab=128, experts=64, top_k=6,
              router_groups=4, router_group_topk=2, dispatch="deepep", routing_skew=0.7)


@pytest.mark.parametrize("by_sender", [False, True])
@pytest.mark.parametrize("stride", [1, 2])
def test_each_link_carries_the_deepep_flows_bytes(by_sender, stride):
    cluster = build_cluster("dgx-h100", nodes=4, fabric="rail")
    group = tuple(range(0, cluster.num_devices, stride))
    tokens, row = 1024, 2048.0
    counts = expert_counts(M, 3, tokens)
    sizes = [row * sum(counts[j * 64 // len(group):(j + 1) * 64 // len(group)])
             for j in range(len(group))]
    split = deepep_split(M, counts, tokens, row, sizes)
    split = split.transpose() if by_sender else split
    assert split.deepep is not None
    ((*sets,),) = lower_deepep(cluster, group, split)
    got: Counter[int] = Counter()
    for flows, factor in sets:
        for link, count in zip(flows.links, flows.counts):
            got[link] += count * factor * split.mean_send_bytes
    want: Counter[int] = Counter()
    for a, b, size in deepep_flows(split.deepep, group, [cluster.server_of(r) for r in group]):
        for link in (hop(cluster, b, a) if by_sender else hop(cluster, a, b)):
            want[link] += size
    assert set(got) == set(want)
    assert all(got[link] == pytest.approx(want[link], rel=1e-9) for link in want)
    name, lowering = Collectives(cluster).resolve(OpKind.ALL_TO_ALL, group,
                                                  split.mean_send_bytes, split=split)
    assert name == "deepep" and lowering == lower_deepep(cluster, group, split)
