"""Group-limited routing: the rules of its keys and how many distinct tokens reach a set of experts.

Megatron-Core's group-limited top-k (moe_router_num_groups G, moe_router_group_topk M;
DeepSeek-V3's node-limited routing, G = 8, M = 4) splits the E experts into G groups of E/G
contiguous experts, keeps each token's M best groups and picks its k experts inside them
(`group_limited_topk` follows megatron/core/transformer/moe/moe_utils.py: a group scores the
sum of its top k/M affinities). G = 0 is plain top-k: one group, M = 1.

The expectation parasim uses (deterministic, like `traces.moe_spec`): a token's M groups are
equally likely and its k experts equally likely among those groups' M·E/G experts, so every
expert still gets T·k/E of T tokens and only which experts share a token changes. A token
reaches a set D of experts (a rank's, a node's) with probability

    P(D) = Σ_S P(S) · (1 - C(M·E/G - |D ∩ S|, k) / C(M·E/G, k))

over the equally likely M-subsets S of groups. `distinct_tokens` turns routed counts into
tokens: D's c_D (token, expert) pairs come from c_D·E·P(D)/(k·|D|) distinct tokens (T·P(D)
when balanced; at most T), the rows a once-per-destination dispatch (`traces.deepep`) sends.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from math import comb
from typing import Protocol

from traces.errors import ConfigError, show

ROUTING_KEYS = ("router_groups", "router_group_topk", "force_balance", "dispatch")
"""The `[model]` keys of routing as trained (written in a header only where set)."""
DISPATCHES = ("nccl", "deepep", "hybridep")
FORWARDING = ("deepep", "hybridep")
"""The dispatches that cross the network once per NVLink domain and forward inside it
(`traces.deepep`, `traces.hybridep`)."""
MAX_GROUPS = 2**14  # at most one group per expert (MAX_EXPERTS)


class RoutingSpec(Protocol):
    """The fields of `traces.model.ModelSpec` these rules read."""

    @property
    def experts(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    @property
    def router_groups(self) -> int: ...
    @property
    def router_group_topk(self) -> int: ...
    @property
    def force_balance(self) -> bool: ...
    @property
    def dispatch(self) -> str: ...


def check_routing(m: RoutingSpec) -> None:
    """The routing keys' types and rules, one ConfigError line each."""
    g, mg, k, e = m.router_groups, m.router_group_topk, m.top_k, m.experts
    for name, value in (("router_groups", g), ("router_group_topk", mg)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_GROUPS:
            raise ConfigError(f"model.{name}: {show(value)} must be an integer from 0 to "
                              f"{MAX_GROUPS:,}")
    if not isinstance(m.force_balance, bool):
        raise ConfigError(f"model.force_balance: {show(m.force_balance)} must be true or false")
    if not isinstance(m.dispatch, str) or m.dispatch not in DISPATCHES:
        raise ConfigError(f"model.dispatch: {show(m.dispatch)} is not one of "
                          f"{', '.join(DISPATCHES)}")
    if not e:
        for name in ("router_groups", "router_group_topk", "force_balance"):
            if getattr(m, name):
                raise ConfigError(f"model.{name}: {show(getattr(m, name))} needs model.experts "
                                  "> 0 (a dense model has no router)")
        if m.dispatch != "nccl":
            raise ConfigError(f"model.dispatch: {show(m.dispatch)} needs model.experts > 0 (a "
                              "dense model dispatches no tokens)")
        return
    if mg and not g:
        raise ConfigError(f"model.router_group_topk: {mg} needs model.router_groups > 0")
    if not g:
        return
    if e % g:
        raise ConfigError(f"model.router_groups: {g} must divide model.experts = {e}")
    if not 1 <= mg <= g:
        raise ConfigError(f"model.router_group_topk: {show(mg)} must be from 1 to "
                          f"model.router_groups = {g}")
    if isinstance(k, int) and k > mg * (e // g):
        raise ConfigError(f"model.top_k: {k} must be at most router_group_topk x experts / "
                          f"router_groups = {mg * (e // g)} (the chosen groups' experts)")


def group_shape(m: RoutingSpec) -> tuple[int, int]:
    """(G, M): the expert groups and the groups a token may use; (1, 1) without groups."""
    return (m.router_groups, m.router_group_topk) if m.router_groups else (1, 1)


def reach(m: RoutingSpec, experts: Sequence[int]) -> float:
    """P(D): the probability one token's k experts include one of `experts` (module
    docstring)."""
    groups, top = group_shape(m)
    size = m.experts // groups
    overlap = [0] * groups
    for x in set(experts):
        overlap[x // size] += 1
    return _reach(groups, top, size, m.top_k, tuple(sorted(overlap)))


@lru_cache(maxsize=4096)
def _reach(groups: int, top: int, size: int, k: int, overlap: tuple[int, ...]) -> float:
    ways: dict[tuple[int, int], int] = {(0, 0): 1}  # (groups chosen, experts of D in them)
    for a in overlap:
        step = dict(ways)
        for (j, s), n in ways.items():
            if j < top:
                step[j + 1, s + a] = step.get((j + 1, s + a), 0) + n
        ways = step
    pool = top * size
    miss = sum(Fraction(n * comb(pool - s, k), comb(pool, k))
               for (j, s), n in ways.items() if j == top)
    return float(1 - miss / comb(groups, top))


def distinct_tokens(m: RoutingSpec, experts: Sequence[int], routed: float, tokens: int
                    ) -> float:
    """Distinct tokens among `routed` (token, expert) pairs to `experts` from a rank's
    `tokens` (module docstring): routed·E·P(D)/(k·|D|), at most `tokens`."""
    if not routed:
        return 0.0
    per_token = m.top_k * len(set(experts)) / (m.experts * reach(m, experts))
    return min(float(tokens), routed / per_token)


def sample_routes(m: RoutingSpec, tokens: int, seed: int) -> list[tuple[int, ...]]:
    """Tokens routed by the expectation's own model: M equally likely groups, then k equally
    likely experts among theirs (the reference `reach` is checked against)."""
    groups, top = group_shape(m)
    size = m.experts // groups
    rng = random.Random(seed)
    out = []
    for _ in range(tokens):
        chosen = rng.sample(range(groups), top)
        pool = [g * size + i for g in chosen for i in range(size)]
        out.append(tuple(sorted(rng.sample(pool, m.top_k))))
    return out


def group_limited_topk(m: RoutingSpec, scores: Sequence[float]) -> tuple[int, ...]:
    """One token's experts as Megatron-Core's group_limited_topk picks them from its
    affinities: groups ranked by the sum of their top k/M scores, the best M kept, then the
    top k experts inside them (ties to the lower index)."""
    groups, top = group_shape(m)
    size = m.experts // groups
    per = max(1, m.top_k // top)
    score = [sum(sorted(scores[g * size:(g + 1) * size], reverse=True)[:per])
             for g in range(groups)]
    kept = sorted(range(groups), key=lambda g: (-score[g], g))[:top]
    pool = [g * size + i for g in kept for i in range(size)]
    return tuple(sorted(sorted(pool, key=lambda x: (-scores[x], x))[:m.top_k]))
