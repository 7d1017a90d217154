"""The causes a run's Monte-Carlo draws from, from the fleet, the hand rates and the keys.

* Rates: the fleet's (`sim.goodput.fleets`, the accelerator's default where none is named),
  each overridden by `[reliability.rates]`, silent data corruption from `sdc_rate`.
* `mtti` given: the fleet's causes scaled to that total, so the hardware share still waits
  for a repair or a spare as the same rates given by component would (a fleet without
  rates, a TPU with only `mtti`, has the one cause "unattributed").
* Silent data corruption is found at the next check when a check key is given (half an
  interval later on average), at once otherwise; checks cost only when a check key is given.
* A loss spike (`loss_spike_rate` per job-hour) restarts from the last checkpoint and
  rolls back `rollback` more compute.
* Spares: the fleet's where its source gives them, else the fewest with which a hardware
  failure finds a spare 99% of the time: nodes in repair are Poisson with mean (hardware
  failures per second) x (repair seconds) (an M/G/inf queue), so the smallest s with
  P(in repair < s) >= 0.99. Published fleets at scale keep spares (BLOOM: 4 on 48 nodes).
"""

from __future__ import annotations

import math

from sim.goodput.badput import Phases
from sim.goodput.costs import Restart
from sim.goodput.fleets import Fleet, fleet_for
from sim.goodput.montecarlo import Cause
from sim.goodput.rates import HARDWARE, Component
from sim.goodput.settings import Reliability
from topology.cluster import Cluster

GIVEN = "unattributed"
"""The one cause of a run whose MTTI is set directly and whose fleet has no rates."""
LOSS_SPIKE = "loss_spike"
SDC_CHECK_INTERVAL_S = 3600.0
SDC_CHECK_COST_S = 60.0
SPARE_COVER = 0.99
"""A hardware failure finds a spare this often, with the default pool."""
NORMAL_ABOVE = 100.0
Z99 = 2.3263
"""The standard normal's 99th percentile."""


def run_fleet(rel: Reliability, cluster: Cluster) -> Fleet:
    """The fleet whose rates the run takes (refused for a TPU with nothing given)."""
    return fleet_for(rel.fleet, tpu=cluster.accelerator.name.startswith("TPU"),
                     by_hand=bool(rel.rates_per_hour) or rel.mtti_s is not None)


def rates_per_hour(rel: Reliability, fleet: Fleet) -> dict[Component, float]:
    """Per-instance rates: the fleet's, overridden per component by hand, and `sdc_rate`."""
    return {**{c: fleet.rate(c) for c in Component}, **rel.rates_per_hour,
            Component.SDC: rel.sdc_rate_per_hour}


def sdc_checks(rel: Reliability) -> tuple[float, float] | None:
    """(interval, cost) of silent-data-corruption checks, or None when no check key is given."""
    if rel.sdc_check_interval_s is None and rel.sdc_check_cost_s is None:
        return None
    return (rel.sdc_check_interval_s or SDC_CHECK_INTERVAL_S,
            rel.sdc_check_cost_s if rel.sdc_check_cost_s is not None else SDC_CHECK_COST_S)


def run_causes(rel: Reliability, per_cause: dict[Component, float],
               restart: Restart) -> tuple[Cause, ...]:
    """The Monte-Carlo's causes: one per component with a rate (scaled to a given MTTI)."""
    base = restart.seconds(waits_for_repair=False)
    hang = restart.watchdog_s - restart.detection_s if restart.fixed_s is None else 0.0
    total = sum(per_cause.values())
    scale = 1.0
    if rel.mtti_s is not None:
        if total <= 0:
            return (Cause(GIVEN, 1.0 / rel.mtti_s, base, False, hang, phases=restart.phases()),
                    *_spikes(rel, base, restart.phases()))
        scale = 1.0 / (rel.mtti_s * total)
    checks = sdc_checks(rel)
    delay = checks[0] / 2 if checks else 0.0  # found at the next check
    out = []
    for c, rate in per_cause.items():
        if rate > 0:
            wasted = delay if c is Component.SDC else 0.0
            out.append(Cause(str(c), rate * scale, base + wasted,
                             c in HARDWARE and restart.fixed_s is None, hang,
                             phases=restart.phases(wasted)))
    return (*out, *_spikes(rel, base, restart.phases()))


def _spikes(rel: Reliability, base: float, phases: Phases) -> tuple[Cause, ...]:
    """Loss spikes: a restart without a repair wait, and the work back to their checkpoint."""
    rate = rel.loss_spike_rate_per_hour / 3600.0
    if rate <= 0:
        return ()
    return (Cause(LOSS_SPIKE, rate, base, False, 0.0, rel.rollback_s, phases=phases),)


def default_spares(causes: tuple[Cause, ...], repair_s: float) -> int:
    """The fewest spares a hardware failure finds free SPARE_COVER of the time (docstring)."""
    mean = sum(c.rate_per_s for c in causes if c.hardware) * repair_s
    if mean <= 0:
        return 0
    if mean > NORMAL_ABOVE:  # e^-mean underflows: the normal approximation's 99th percentile
        return math.ceil(mean + Z99 * math.sqrt(mean)) + 1
    spares, term = 0, math.exp(-mean)
    cdf = term  # P(in repair <= spares), one count at a time
    while cdf < SPARE_COVER:
        spares += 1
        term *= mean / spares
        cdf += term
    return spares + 1  # P(in repair <= spares) >= cover: one more than that many is free
