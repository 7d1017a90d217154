"""Max-min fair sharing of links among groups of flows.

A *flow group* is a set of flows that move at one common rate (the channels of a pipelined
ring progress at the pace of their slowest hop). Group g puts `counts[k]` of its flows on link
`links[k]`. The allocation is per-flow max-min fair: repeatedly find the link whose remaining
capacity, split over the flows still unfixed on it, is smallest; fix every unfixed group crossing
it at that share; subtract what they use everywhere; go on until every group is fixed.
"""

from collections.abc import Sequence

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
    rates: list[float | None] = [None] * len(groups)
    for g, (links, _) in enumerate(groups):
        if not links:
            rates[g] = float("inf")
    while load:
        bottleneck = min(load, key=lambda link: remaining[link] / load[link])
        share = max(remaining[bottleneck] / load[bottleneck], 0.0)
        for g in users[bottleneck]:
            if rates[g] is not None:
                continue
            rates[g] = share
            for link, count in zip(*groups[g]):
                remaining[link] -= count * share
                load[link] -= count
                if load[link] == 0:
                    del load[link]
    return rates  # type: ignore[return-value]
