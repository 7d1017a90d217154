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


def max_min_rates(groups: Sequence[FlowGroup], capacity: Sequence[float]) -> list[float]:
    """Rate per flow (bytes/s) of each group; a group with no links gets +inf."""
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


def max_min_matrix(counts: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """The same allocation with numpy, for large components: `counts[l, g]` flows of group g
    on link l (every row used by some group), `capacity[l]` bytes/s. Returns rates per group."""
    remaining = capacity.astype(float)
    rates = np.zeros(counts.shape[1])
    unfixed = np.ones(counts.shape[1], dtype=bool)
    load = counts.sum(axis=1).astype(float)
    while unfixed.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(load > 0, remaining / load, np.inf)
        bottleneck = int(share.argmin())
        level = max(float(share[bottleneck]), 0.0)
        fixed = unfixed & (counts[bottleneck] > 0)
        rates[fixed] = level
        used = counts[:, fixed].sum(axis=1)
        remaining -= level * used
        load -= used
        unfixed &= ~fixed
    return rates
