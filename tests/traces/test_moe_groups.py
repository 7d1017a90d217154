"""Group-limited routing: spans, the reach formula against sampling, the keys' rules,
force_balance."""

from __future__ import annotations

import dataclasses
import random
from math import comb

import pytest

from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe import skewed_experts
from traces.moe_groups import group_limited_topk, reach, sample_routes
from traces.moe_spec import expert_counts

# DeepSeek-V3's router: 256 experts, top-8, 8 groups, top 4 groups (its report, node-limited
# routing M = 4; Megatron-Bridge's recipe: moe_router_num_groups 8, moe_router_group_topk 4)
V3 = ModelSpec(layers=4, hidden=64, heads=4, seq_len=256, vocab=128, experts=256, top_k=8,
               router_groups=8, router_group_topk=4)


def _groups(experts: tuple[int, ...], m: ModelSpec) -> set[int]:
    return {x // (m.experts // m.router_groups) for x in experts}


@pytest.mark.parametrize(("groups", "top", "k"), [(8, 4, 8), (8, 1, 8), (16, 3, 6), (4, 2, 2)])
def test_no_tokens_experts_span_more_than_router_group_topk_groups(groups, top, k):
    m = dataclasses.replace(V3, router_groups=groups, router_group_topk=top, top_k=k)
    rng = random.Random(7)
    for _ in range(500):
        chosen = group_limited_topk(m, [rng.random() for _ in range(m.experts)])
        assert len(set(chosen)) == k
        assert len(_groups(chosen, m)) <= top
    for route in sample_routes(m, 500, seed=3):
        assert len(set(route)) == k and len(_groups(route, m)) <= top


def test_plain_topk_reach_is_one_minus_the_hypergeometric_miss():
    m = dataclasses.replace(V3, router_groups=0, router_group_topk=0)
    assert reach(m, range(32)) == pytest.approx(1 - comb(224, 8) / comb(256, 8), rel=1e-12)
    assert reach(m, range(256)) == 1.0


def test_group_limited_reach_in_closed_form():
    # one node holds one group: chosen with probability 4/8, then missed by the k = 8 experts
    # drawn from the chosen 128 with probability C(96, 8) / C(128, 8)
    assert reach(V3, range(32)) == pytest.approx(0.5 * (1 - comb(96, 8) / comb(128, 8)))
    assert 8 * reach(V3, range(32)) == pytest.approx(3.629, abs=1e-3)  # nodes per token


@pytest.mark.parametrize("experts", [range(32), range(8), range(16, 48), range(0, 256, 5)])
def test_reach_equals_the_fraction_of_sampled_tokens_that_reach_the_experts(experts):
    routes = sample_routes(V3, 20_000, seed=11)
    wanted = set(experts)
    hit = sum(1 for r in routes if wanted & set(r)) / len(routes)
    assert hit == pytest.approx(reach(V3, experts), abs=0.012)


@pytest.mark.parametrize(("changes", "line"), [
    ({"router_groups": 7}, "model.router_groups: 7 must divide model.experts = 256"),
    ({"router_group_topk": 9}, "model.router_group_topk: 9 must be from 1 to "
                               "model.router_groups = 8"),
    ({"router_group_topk": 0}, "model.router_group_topk: 0 must be from 1 to"),
    ({"router_groups": 0}, "model.router_group_topk: 4 needs model.router_groups > 0"),
    ({"router_group_topk": 1, "router_groups": 64},
     "model.top_k: 8 must be at most router_group_topk x experts / router_groups = 4"),
    ({"router_groups": -1}, "model.router_groups: -1 must be an integer from 0 to 16,384"),
    ({"force_balance": 1}, "model.force_balance: 1 must be true or false"),
    ({"dispatch": "nvshmem"}, "model.dispatch: 'nvshmem' is not one of nccl, deepep, hybridep"),
])
def test_bad_routing_keys_are_one_line_each(changes, line):
    with pytest.raises(ConfigError) as error:
        dataclasses.replace(V3, **changes)
    text = str(error.value)
    assert text.startswith(line) and "\n" not in text


def test_dense_model_refuses_routing_keys():
    dense = ModelSpec(layers=4, hidden=64, heads=4, seq_len=256, vocab=128)
    for changes in ({"router_groups": 8}, {"force_balance": True}, {"dispatch": "deepep"},
                    {"dispatch": "hybridep"}):
        with pytest.raises(ConfigError, match=r"needs model\.experts > 0"):
            dataclasses.replace(dense, **changes)


def test_force_balance_gives_equal_counts_whatever_the_skew():
    skewed = dataclasses.replace(V3, routing_skew=1.0)
    forced = dataclasses.replace(skewed, force_balance=True)
    assert len(set(expert_counts(skewed, 5, 4096))) > 1
    for layer in (3, 4):
        assert expert_counts(forced, layer, 4096) == (4096 * 8 // 256,) * 256
    layout = Layout(dp=8, ep=8, micro_batch=1, global_batch=8)
    assert skewed_experts(skewed, layout) and not skewed_experts(forced, layout)
