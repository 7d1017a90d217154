"""How per-rank variation of compute speed stretches a step: order statistics for the expected
step, seeded draws for Monte-Carlo runs of unfolded plans.

A rank's kernels all take `s` times as long for the step, `s = (1 + jitter z) k`, z ~ N(0, 1)
drawn per rank and step, `k = slow_factor` on a slow node (each node slow with probability
`slow_nodes`, independently), else 1 (`topology.variability.Variability`).

    speeds = sample_speeds(variability, world, devices_per_server, seed)   # one draw per rank
    speeds = expected_speeds(variability, layout, ranks, devices_per_server)  # order statistics

A group that meets waits for its slowest member, so what a step costs is the expected maximum
of the draws of the ranks it waits for, not their mean. Two kinds of wait set the pace:

  - the tensor- and context-parallel collectives of every layer: the ranks of one pipeline
    member (its TP x CP group) move at the pace of their slowest, `e_member`;
  - the pipeline exchanges in the steady state and the data-parallel reduction and step end:
    every pipeline runs at the pace of its slowest stage, and the step ends when the slowest
    pipeline does, so the steady state moves at the pace of the slowest rank of the job,
    `e_world`.

A pipeline of stages taking t_p per micro-batch runs a 1F1B (or GPipe) step in
sum_p t_p + (M - 1) max_p t_p: one slot through every stage (filling and draining), M - 1 more
on the bottleneck stage. The first part sums members that each wait for their own slowest
(e_member), the second waits for the slowest of the job (e_world), so every rank's kernels
are stretched by the slot-weighted mean (pp stages of a slot each; (pp - 1) / vp + 1
interleaved; zero-bubble (zb1p, the V) and DualPipe: `fill_slots`)

    e = (F * e_member + (M - 1) * e_world) / (F + M - 1),   F = (pp - 1) / vp + 1

(pp = 1: e_world: the one stage's M slots all wait for the data-parallel reduction).

E[max] of a group is exact for the draw model: with g_n members on node n,
P(max <= x) = prod_n [(1 - p) Phi((x - 1) / j)^g_n + p Phi((x / k - 1) / j)^g_n], integrated
numerically. Its composition across the waits (the formula above) is the approximation; the
seeded Monte-Carlo of unfolded runs (`sample_speeds`) bounds its error (tests/sim/models).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

import numpy as np

from topology.variability import Variability
from traces.layout import Layout

MIN_DRAW = 0.05
"""Draws are clipped here (z below -3.8 sigma at the largest jitter): a kernel never runs in
no time."""
GRID_POINTS_PER_SIGMA = 64


def expected_max(v: Variability, per_node: Iterable[int]) -> float:
    """E[max of the draws] of a group with `per_node[n]` members on node n."""
    counts = tuple(sorted(Counter(g for g in per_node if g > 0).items()))
    assert counts, "a group has members"
    return _expected_max(v.jitter, v.slow_nodes, v.slow_factor, counts)


@lru_cache(maxsize=256)
def _expected_max(j: float, p: float, k: float, counts: tuple[tuple[int, int], ...]) -> float:
    nodes = sum(n for _, n in counts)
    if p == 0 or k == 1:
        p, k = 0.0, 1.0
    if j == 0:  # only slow nodes: the group is slow when any of its nodes is
        return 1.0 + (1.0 - (1.0 - p) ** nodes) * (k - 1.0)
    from scipy.special import log_ndtr  # here: scipy's import is a tenth of a second that an
    # ideal cluster (no jitter) never needs

    lo, hi = 1.0 - 12 * j, k * (1.0 + 12 * j)
    x = np.linspace(lo, hi, int((hi - lo) / j * GRID_POINTS_PER_SIGMA) + 2)
    log_f = np.zeros_like(x)
    for g, n in counts:  # n nodes of g members each
        fast = g * log_ndtr((x - 1.0) / j)
        if p == 0:
            node = fast
        else:
            slow = g * log_ndtr((x / k - 1.0) / j)
            node = np.logaddexp(np.log1p(-p) + fast, np.log(p) + slow) if p < 1 else slow
        log_f += n * node
    tail = 1.0 - np.exp(log_f)  # P(max > x); E[max] = lo + integral of it from lo
    return float(lo + np.sum((tail[1:] + tail[:-1]) * np.diff(x)) / 2)


def _per_node(ranks: Iterable[int], devices_per_server: int) -> list[int]:
    return list(Counter(r // devices_per_server for r in ranks).values())


def step_stretch(v: Variability, layout: Layout, devices_per_server: int,
                 rank: int = 0) -> float:
    """The expected stretch `e` of the module docstring for `rank`'s pipeline member."""
    if v.ideal:
        return 1.0
    world = expected_max(v, _per_node(range(layout.world), devices_per_server))
    if layout.pp == 1:
        return world
    c = layout.coords(rank)
    member = [layout.rank(tp=t, cp=k, dp=c.dp, pp=c.pp)
              for t in range(layout.tp) for k in range(layout.cp)]
    e_member = expected_max(v, _per_node(member, devices_per_server))
    fill = fill_slots(layout)
    steady = layout.num_microbatches - 1
    return (fill * e_member + steady * world) / (fill + steady)


def fill_slots(layout: Layout) -> float:
    """F of the module docstring: one slot through every stage plus what the schedule's step
    takes beyond M slots, a slot being one micro-batch's whole-stage pass (F + B + W). At
    equal chunk passes (a full backward twice a forward) that excess is (pp - 1) / vp slots
    under 1F1B and interleaving, (pp - 1) / (3 vp) under zb1p (ZB-H1's bubble of pp - 1
    chunk passes, F + B - W, in a slot of 3 vp), (pp - 1) / 6 under zbv and dualpipev (a step
    of 6M + pp - 1 chunk passes, two chunks a rank) and (pp/2 - 1) / 3 under dualpipe
    (3M + pp/2 - 1 passes of one whole stage, its pairs run one after the other:
    `traces.zero_bubble.makespan`)."""
    pp, schedule = layout.pp, str(layout.schedule)
    if schedule == "dualpipe":
        return 1 + (pp / 2 - 1) / 3
    if schedule == "zb1p":
        return 1 + (pp - 1) / (3 * layout.vp)
    if schedule in ("zbv", "dualpipev"):
        return 1 + (pp - 1) / 6
    return (pp - 1) / layout.vp + 1


def expected_speeds(v: Variability, layout: Layout, ranks: Iterable[int],
                    devices_per_server: int) -> dict[int, float]:
    """Each rank's kernel stretch in the expected step (1.0 each when `v` is ideal)."""
    return {r: step_stretch(v, layout, devices_per_server, r) for r in ranks}


def sample_speeds(v: Variability, ranks: Sequence[int], devices_per_server: int,
                  seed: int) -> dict[int, float]:
    """One seeded draw of every rank's stretch for a step (a Monte-Carlo sample)."""
    rng = np.random.default_rng(seed)
    nodes = max(ranks) // devices_per_server + 1
    slow = rng.random(nodes) < v.slow_nodes
    z = rng.standard_normal(len(ranks))
    return {r: max(1.0 + v.jitter * float(zr), MIN_DRAW)
            * (v.slow_factor if slow[r // devices_per_server] else 1.0)
            for r, zr in zip(ranks, z)}


def speeds_differ(speeds: Mapping[int, float] | None) -> bool:
    return speeds is not None and any(s != 1.0 for s in speeds.values())
