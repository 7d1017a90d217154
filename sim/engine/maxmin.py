"""Max-min fair sharing of links among groups of flows.

A *flow group* is a set of flows that move at one common rate (the channels of a pipelined
ring progress at the pace of their slowest hop). Group g puts `counts[k]` of its flows on link
`links[k]`. The allocation is per-flow max-min fair: repeatedly find the link whose remaining
capacity, split over the flows still unfixed on it, is smallest; fix every unfixed group crossing
it at that share; subtract what they use everywhere; go on until every group is fixed.
"""

from collections.abc import Sequence

import numpy as np

FlowGroup = tuple[Sequence[int], Sequence[int]]


ARRAY_FROM = 20_000
"""Link entries (over all groups) from which `max_min_rates` runs on arrays (a collective
over thousands of servers); below, dicts are faster."""
ARRAY_GROUPS = 64
"""The most groups the array form takes (it tests each group for the bottleneck)."""


def max_min_rates(groups: Sequence[FlowGroup], capacity: Sequence[float]) -> list[float]:
    """Rate per flow (bytes/s) of each group; a group with no links gets +inf."""
    if len(groups) <= ARRAY_GROUPS and sum(len(links) for links, _ in groups) >= ARRAY_FROM:
        return _on_arrays(groups, capacity)
    load: dict[int, int] = {}
    users: dict[int, list[int]] = {}
    for g, (links, counts) in enumerate(groups):
        for link, count in zip(links, counts):
            load[link] = load.get(link, 0) + count
            users.setdefault(link, []).append(g)
    remaining = {link: capacity[link] for link in load}
    fixed = [not links for links, _ in groups]
    rates = [float("inf") if done else 0.0 for done in fixed]
    while load:
        bottleneck = min(load, key=lambda link: remaining[link] / load[link])
        share = max(remaining[bottleneck] / load[bottleneck], 0.0)
        for g in users[bottleneck]:
            if fixed[g]:
                continue
            fixed[g], rates[g] = True, share
            for link, count in zip(*groups[g]):
                remaining[link] -= count * share
                load[link] -= count
                if load[link] == 0:
                    del load[link]
    return rates


def _on_arrays(groups: Sequence[FlowGroup], capacity: Sequence[float]) -> list[float]:
    """`max_min_rates` with numpy, the same floats: links kept in the order the dict form
    first meets them (so the first of equal shares is the same bottleneck), each group's use
    subtracted in the same order with the same products."""
    ids = [np.asarray(links, dtype=np.int64) for links, _ in groups]
    every = np.concatenate(ids)
    distinct, first, inverse = np.unique(every, return_index=True, return_inverse=True)
    rank = np.empty(len(distinct), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(distinct))
    position = rank[inverse]  # each entry's place in first-met order
    order = np.empty(len(distinct), dtype=np.int64)
    order[rank] = distinct
    remaining = np.asarray(capacity, dtype=float)[order]
    load = np.zeros(len(order), dtype=np.int64)
    places, counts = [], []
    start = 0
    for links in ids:
        places.append(position[start:start + len(links)])
        start += len(links)
    for g, (_, n) in enumerate(groups):
        counts.append(np.asarray(n, dtype=np.int64))
        np.add.at(load, places[g], counts[g])
    fixed = [not len(links) for links, _ in groups]
    rates = [float("inf") if done else 0.0 for done in fixed]
    while (load > 0).any():
        with np.errstate(divide="ignore", invalid="ignore"):
            shares = np.where(load > 0, remaining / load, np.inf)
        bottleneck = int(shares.argmin())
        share = max(float(remaining[bottleneck]) / int(load[bottleneck]), 0.0)
        for g in range(len(groups)):
            if fixed[g] or not (places[g] == bottleneck).any():
                continue
            fixed[g], rates[g] = True, share
            remaining[places[g]] -= counts[g] * share
            load[places[g]] -= counts[g]
    return rates


def max_min_matrix(counts: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """The same allocation with numpy, for large components: `counts[l, g]` flows of group g
    on link l (every row used by some group), `capacity[l]` bytes/s. Returns rates per group."""
    remaining = capacity.astype(float)
    rates = np.zeros(counts.shape[1])
    unfixed = np.ones(counts.shape[1], dtype=bool)
    load = counts.sum(axis=1).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        while unfixed.any():
            share = np.where(load > 0, remaining / load, np.inf)
            bottleneck = int(share.argmin())
            level = max(float(share[bottleneck]), 0.0)
            fixed = unfixed & (counts[bottleneck] > 0)
            rates[fixed] = level
            used = counts @ fixed  # the fixed groups' flows per link (whole numbers: exact)
            remaining -= level * used
            load -= used
            unfixed &= ~fixed
    return rates
