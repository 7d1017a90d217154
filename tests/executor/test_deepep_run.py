"""The executor runs DeepEP / HybridEP dispatch as two hops (`executor.hops`) and sigmoid
routing with an expert bias (`executor.routing`), on gloo with nodes emulated by
`gpus_per_node`; training equals the single-process reference, every call is the plan's, and
the network hop carries each token once per destination node, counted from the routing."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

import torch

from executor.deepep import NodeMap, combine_hops, dispatch_hops
from executor.launch import spawn
from executor.reference import train
from executor.routing import gates, route
from tests.executor.checks import check_training
from tests.executor.plan_match import call_sequences, plan_sequences
from tests.executor.test_moe import MOE, SKEW
from tests.executor.workers import ADAMW, OPTIONS, SMALL, Case, interpret_cases
from traces.model import ModelSpec
from traces.plan import build

TIMEOUT_S = 120
SIGMOID = dict(moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True)
WORLD4 = {
    # two nodes of two: the network hop to the other node's relay, then NVLink forwarding
    "deepep-ep4-2nodes-skew": Case(dict(ep=4, dp=4, global_batch=4),
                                   model=dict(SKEW, routing_skew=2.0, dispatch="deepep"),
                                   gpus_per_node=2),
    # uneven nodes {0, 1, 2} and {3}: rank 3 relays for all three, rank 0 for rank 3
    "hybridep-ep4-uneven-capacity": Case(dict(ep=4, dp=4, global_batch=4),
                                         model=dict(SKEW, dispatch="hybridep",
                                                    capacity_factor=1.0), gpus_per_node=3),
    # one node: no network hop, every row forwarded inside it; sigmoid gates with a bias
    "deepep-ep2-tp2-sp-dp2-one-node-sigmoid": Case(
        dict(tp=2, sp=True, ep=2, dp=2, global_batch=4),
        model=dict(SKEW, dispatch="deepep", **SIGMOID), gpus_per_node=4),
    # overlap_moe_comm: the hops on the EP stream, beside another micro-batch's compute
    "deepep-ep4-overlap-2nodes": Case(dict(ep=4, dp=4, global_batch=8,
                                           overlap_moe_comm=True),
                                      model=dict(SKEW, dispatch="deepep"), gpus_per_node=2),
    # NCCL's all-to-all with sigmoid scores, top-k normalised, and the aux-loss-free bias
    "sigmoid-bias-ep4-dp4": Case(dict(ep=4, dp=4, global_batch=4), model=dict(MOE, **SIGMOID)),
}


@pytest.fixture(scope="module")
def world() -> dict[str, list]:
    results, _ = spawn(interpret_cases, 4, (list(WORLD4.values()), False), timeout_s=TIMEOUT_S)
    return {name: list(per_rank) for name, per_rank in zip(WORLD4, zip(*results))}


@pytest.mark.parametrize("name", list(WORLD4))
def test_training_equals_the_reference_and_calls_are_the_plans(world: dict, name: str) -> None:
    model, layout = WORLD4[name].specs()
    run = train(model, layout.global_batch, WORLD4[name].steps, OPTIONS.seed, ADAMW,
                layout=layout)
    results = world[name]
    worst = check_training(model, layout, results, run)
    assert worst["param"] <= 1e-6
    for res in results:
        assert res["grad_norm"] == pytest.approx(run.grad_norms[-1], rel=1e-5)
    plan = build(model, layout)
    for rank, res in enumerate(results):  # one logged all-to-all per plan op, NCCL's splits
        assert call_sequences(res["calls"]) == plan_sequences(plan.ops[rank], rank)


def _routing(skew: float = 2.0, tokens: int = 16):
    model = ModelSpec(**{**SMALL, **MOE, "experts": 8, "top_k": 3, "routing_skew": skew})
    return route(model, 1, tokens)


@pytest.mark.parametrize("gpus_per_node", [1, 2, 3, 4])
def test_the_network_hop_carries_each_token_once_per_destination_node(gpus_per_node: int
                                                                      ) -> None:
    """Dispatch hop 1: source i sends the relay of each other node the distinct tokens with
    a kept expert there (counted from the [T, k] choices); hop 2 stays inside nodes. The
    combine's network hop carries every (token, expert) row of the node's experts back."""
    r = _routing()
    ep, per = 4, 2
    nodes = NodeMap([j // gpus_per_node for j in range(ep)])
    for i in range(ep):
        dispatch, combine = dispatch_hops(r, nodes, i), combine_hops(r, nodes, i)
        for q in range(ep):
            node = nodes.node_of[q]
            if nodes.same(i, q) or nodes.relay(i, node) != q:
                assert dispatch.hops[0].sent[q] == 0
                continue
            here = [j for j in range(ep) if nodes.node_of[j] == node]
            experts = torch.tensor([e for j in here for e in range(j * per, (j + 1) * per)])
            hit = (torch.isin(r.experts, experts) & r.kept).any(dim=1)
            assert dispatch.hops[0].sent[q] == int(hit.sum())
        for q in range(ep):  # forwarding is inside the node
            assert dispatch.hops[1].sent[q] == 0 or nodes.same(i, q)
            assert combine.hops[0].sent[q] == 0 or nodes.same(i, q)
            assert combine.hops[1].sent[q] == 0 or not nodes.same(i, q)
        # what arrives is NCCL's rows: ep sources times the kept rows of i's experts
        assert len(dispatch.final) == ep * sum(r.local(ep, i))
        assert len(combine.final) == sum(r.counts)
        # once per node: never more than NCCL's rows per (token, expert) across nodes
        pairs = r.per_rank(ep)
        assert sum(dispatch.hops[0].sent) <= sum(pairs[q] for q in range(ep)
                                                 if not nodes.same(i, q))


def test_sigmoid_gates_are_normalised_and_ignore_the_bias() -> None:
    """DeepSeek-V3 eq. 13: g = s / Σ s over the chosen experts, s = sigmoid(logit)."""
    r = _routing(tokens=5)
    logits = torch.randn(5, 8, dtype=torch.float64)
    g = gates(logits, r, "sigmoid")
    s = torch.sigmoid(logits.gather(1, r.experts))
    assert torch.allclose(g, s / s.sum(dim=-1, keepdim=True), rtol=1e-15, atol=0)
    assert torch.allclose(g.sum(dim=-1), torch.ones(5, dtype=torch.float64))
