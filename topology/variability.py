"""`Variability` and `Routing`: how a real fleet departs from the ideal, as read from `[cluster]`.

    [cluster]
    jitter = 0.02        # per-rank coefficient of variation of compute time per step
    slow_nodes = 0.01    # probability that a node is slower than the rest
    slow_factor = 1.5    # how many times as long a slow node's kernels take
    routing = "ecmp"     # dmodk (default) | ecmp | adaptive: how a fat tree picks uplinks
    routing_seed = 0     # the ECMP hash's seed

Plain values, read and bounded by `topology.config`; the variability's effect on a step is
`sim.models.variability`, the routing `topology.fabric`. Defaults are the ideal (today's
model): every rank as fast as the plan says, routes by destination-mod-k.

Typical fleet figures, for users who want them (not defaults, so the shipped examples keep
their numbers): Sinha et al., "Not All GPUs Are Created Equal" (SC'22, arXiv 2208.11035),
measured over 90% of the GPUs of five clusters (Summit, Vortex, Frontera, Longhorn, Corona):
8% average performance variation (max 22%) among GPUs of one SKU, outliers up to 1.5x slower
than the median GPU. An 8% spread over a cluster's GPUs is about +-2 sigma of sigma = 0.02,
so `jitter = 0.02`; outliers 1.5x slow: `slow_factor = 1.5`. Lin et al., "Understanding
Stragglers in Large Model Training Using What-if Analysis" (OSDI'25, arXiv 2505.05713,
ByteDance, five months of LLM jobs) find stragglers persistent on a few machines rather than
spread evenly: a `slow_nodes` of about 0.01 (one node in a hundred) is a starting point.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MAX_JITTER = 0.25
"""A CV above 25% per step is not a healthy fleet but a broken one (and keeps draws > 0)."""
MAX_SLOW_FACTOR = 10.0


class Routing(StrEnum):
    """How a fat tree's leaf picks the uplink of a flow among its equal-cost paths."""

    DMODK = "dmodk"
    """By the destination's index (InfiniBand's ftree engine): static, collision-free for
    shift permutations such as rings."""
    ECMP = "ecmp"
    """By a seeded hash of the flow's 5-tuple, one per queue pair (RoCE fabrics)."""
    ADAPTIVE = "adaptive"
    """Onto the least-loaded uplink (InfiniBand adaptive routing, Spectrum-X)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Variability:
    """Per-step variation of compute speed across ranks."""

    jitter: float = 0.0
    """Coefficient of variation of a rank's compute time per step: its kernels all take
    (1 + jitter * z) times as long, z ~ N(0, 1) drawn once per rank and step."""
    slow_nodes: float = 0.0
    """Probability that a node is slow for the step (independently per node)."""
    slow_factor: float = 1.0
    """How many times as long a slow node's kernels take (>= 1)."""

    @property
    def ideal(self) -> bool:
        return self.jitter == 0 and (self.slow_nodes == 0 or self.slow_factor == 1)


IDEAL = Variability()
