"""DeepEP's byte matrix per link class against NCCL's: routed counts x hidden x bytes, and the
per-node deduplicated form checked against sampled tokens."""

from __future__ import annotations

import dataclasses

import pytest

from traces import alltoallv
from traces.alltoallv import deepep_split
from traces.deepep import DeepEp, deepep_flows, link_class_bytes, nccl_flows
from traces.model import ModelSpec
from traces.moe_groups import reach, sample_routes
from traces.moe_spec import expert_counts

V3 = ModelSpec(layers=4, hidden=7168, heads=4, seq_len=4096, vocab=128, experts=256, top_k=8,
               router_groups=8, router_group_topk=4, dispatch="deepep")
T = 4096
ROW = 7168 * 2  # bf16 hidden state
EP, PER_NODE = 64, 8  # DeepSeek-V3: EP 64 over 8 nodes of 8 GPUs
GROUP = tuple(range(EP))
NODE_OF = [j // PER_NODE for j in range(EP)]
NODE_OF_RANK = dict(zip(GROUP, NODE_OF, strict=True))


def _route(m: ModelSpec, layer: int = 5) -> DeepEp:
    counts = expert_counts(m, layer, T)
    split = deepep_split(m, counts, T, ROW, [0.0] * EP)
    assert split.deepep is not None
    return split.deepep


@pytest.mark.parametrize("skew", [0.0, 1.0])
def test_nccl_bytes_per_link_class_are_routed_counts_times_hidden_times_bytes(skew):
    m = dataclasses.replace(V3, routing_skew=skew)
    counts = expert_counts(m, 5, T)
    per_member = [sum(counts[j * 4:(j + 1) * 4]) for j in range(EP)]
    got = link_class_bytes(nccl_flows(_route(m), GROUP, NODE_OF), NODE_OF_RANK)
    for i in GROUP:
        nv = sum(per_member[j] for j in GROUP if j != i and NODE_OF[j] == NODE_OF[i])
        ib = sum(per_member[j] for j in GROUP if NODE_OF[j] != NODE_OF[i])
        assert got[i] == (nv * 7168 * 2, ib * 7168 * 2)


def _ib(flows) -> float:
    return sum(ib for _, ib in link_class_bytes(flows, NODE_OF_RANK).values())


@pytest.mark.parametrize(("groups", "top", "skew"), [(8, 4, 0.0), (0, 0, 0.0), (8, 4, 1.0),
                                                     (8, 2, 0.5)])
def test_deepeps_infiniband_bytes_are_at_most_nccls(groups, top, skew):
    m = dataclasses.replace(V3, router_groups=groups, router_group_topk=top, routing_skew=skew)
    d = _route(m)
    assert _ib(deepep_flows(d, GROUP, NODE_OF)) < _ib(nccl_flows(d, GROUP, NODE_OF))


def test_deepeps_infiniband_bytes_are_the_per_node_dedup_form():
    d = _route(V3)
    per_node = T * reach(V3, range(32)) * ROW  # a node's 32 experts, one token row each
    got = link_class_bytes(deepep_flows(d, GROUP, NODE_OF), NODE_OF_RANK)
    for i in GROUP:
        assert got[i][1] == pytest.approx(7 * per_node, rel=1e-12)  # the 7 other nodes
    # against tokens routed one by one: distinct tokens reaching node 3's experts
    routes = sample_routes(V3, 20_000, seed=5)
    sampled = sum(1 for r in routes if any(96 <= x < 128 for x in r)) / len(routes)
    assert per_node / (T * ROW) == pytest.approx(sampled, rel=0.03)
    # node-limited routing sends each token to ~3.6 nodes, not the ~5.3 of plain top-8
    plain = dataclasses.replace(V3, router_groups=0, router_group_topk=0)
    assert 8 * reach(V3, range(32)) == pytest.approx(3.63, abs=0.01)
    assert 8 * reach(plain, range(32)) == pytest.approx(5.29, abs=0.01)


def test_deepep_nvlink_forwards_a_token_once_per_gpu():
    d = _route(V3)
    flows = deepep_flows(d, GROUP, NODE_OF)
    into = {j: 0.0 for j in GROUP}
    for _, b, size in flows:
        into[b] += size
    per_gpu = T * reach(V3, range(4)) * ROW  # a GPU's 4 experts
    per_node = T * reach(V3, range(32)) * ROW
    # every GPU relays its node's rows from the 7 senders at its position on the other nodes
    # (7 x per_node, over InfiniBand) and gets one row per token it needs from each of the
    # 56 other senders (its node's 7 directly, the rest forwarded by its node's relays)
    for j in GROUP:
        assert into[j] == pytest.approx(7 * per_node + 56 * per_gpu, rel=1e-12)


def test_a_deepep_split_survives_its_json():
    split = deepep_split(V3, expert_counts(V3, 5, T), T, ROW, [ROW * 512.0] * EP)
    back = alltoallv.from_json(alltoallv.to_json(split))
    assert back == split and back.transpose().deepep == split.deepep


@pytest.mark.parametrize("skew", [0.0, 1.0])
def test_flows_of_a_shifted_placement_equal_the_sender_by_sender_count(skew):
    """`deepep_flows` works positions out once per placement shape; sender by sender (each
    node's tokens counted for every sender) on a group on other nodes, in another node order,
    gives the very flows."""
    d = _route(dataclasses.replace(V3, routing_skew=skew))
    group = tuple(1000 + 3 * j for j in range(EP))
    node_of = [(7 - j // PER_NODE) * 11 for j in range(EP)]  # nodes 77, 66, ..., 0
    nodes: dict[int, list[int]] = {}
    for j in range(EP):
        nodes.setdefault(node_of[j], []).append(j)
    want = []
    for i in range(EP):
        position = nodes[node_of[i]].index(i)
        for node, members in nodes.items():
            relay = i if node == node_of[i] else members[position % len(members)]
            if relay != i:
                want.append((group[i], group[relay], d.tokens_to(members, EP) * d.row))
            want += [(group[relay], group[j], d.tokens_to([j], EP) * d.row)
                     for j in members if j != relay]
    assert deepep_flows(d, group, node_of) == [f for f in want if f[2] > 0]


def test_deepep_combine_sums_in_the_node_then_crosses_infiniband_once_per_node():
    # The combine (the dispatch's split transposed, lowered with its flows reversed:
    # sim.collectives.deepep) sends each GPU's one row per token it received over NVLink to
    # the relay, which sends the node's sum back over InfiniBand once per token and node
    # (DeepEP README, internode combine), not NCCL's one row per (token, expert) pair.
    d = _route(V3)
    split = deepep_split(V3, expert_counts(V3, 5, T), T, ROW, [1.0] * EP).transpose()
    assert split.by_sender and split.deepep == d
    back = [(b, a, size) for a, b, size in deepep_flows(d, GROUP, NODE_OF)]
    got = link_class_bytes(back, NODE_OF_RANK)
    per_gpu = T * reach(V3, range(4)) * ROW
    per_node = T * reach(V3, range(32)) * ROW
    counts = expert_counts(V3, 5, T)
    nccl_ib = 56 * sum(counts[:4]) * ROW  # one row per pair to each of 56 off-node members
    for j in GROUP:
        assert got[j][0] == pytest.approx(56 * per_gpu, rel=1e-12)  # NVLink
        assert got[j][1] == pytest.approx(7 * per_node, rel=1e-12)  # InfiniBand
        assert got[j][1] < nccl_ib
