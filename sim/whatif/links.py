"""What the capture says about communication: calibrate's link fit over its own measured
collectives and transfers, to time the target's communication on the capture's kind of cluster.

    links = learn_links(captured.traces, capture_cluster)
    cluster = links.applied_to(target_cluster)

A cluster's default link figures are a data sheet's (`localhost`: tens of µs), while the
capture's own communication says what a call really costs on the machine it ran on (gloo on a
shared CPU host: milliseconds). `sim.calibrate.links.fit_links` fits each link class's latency,
bandwidth and per-call cost to the capture's `sim.calibrate.observe` samples. Where the
samples do not pin every figure down (one DP capture holds one gradient all-reduce), the fit
still reproduces what was measured, and the figures it could not separate are listed: the
split between latency and bandwidth is then a guess, and the output says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sim.calibrate.links import fit_links
from sim.calibrate.observe import observe
from topology.cluster import Cluster
from topology.override import call_costs, link_figures, with_links
from traces.errors import ConfigError
from traces.ops import Trace


@dataclass(frozen=True, slots=True)
class LearnedLinks:
    """Link figures fitted to a capture's communication."""

    figures: dict[str, tuple[float, float, float]]
    """Per link class: bandwidth (B/s), latency (s), per-call cost (s)."""
    accelerator: str
    """The accelerator of the cluster they were measured on: they hold for its kind only."""
    samples: int
    """Distinct measured communications the fit used."""
    unidentified: tuple[str, ...]
    """Figures the samples did not pin down ("loopback bandwidth", ...)."""
    rms_error: float
    """The fit's relative RMS residual over the samples."""

    def applies_to(self, cluster: Cluster) -> bool:
        """The target runs on the capture's kind of cluster: the same accelerator, and every
        link class it has was fitted."""
        kinds = set(cluster.link_kind)
        return cluster.accelerator.name == self.accelerator and kinds <= set(self.figures)

    def applied_to(self, cluster: Cluster) -> Cluster:
        """`cluster` with the fitted figures on its links (as a calibrated profile's)."""
        return with_links(cluster, {k: (bw, lat) for k, (bw, lat, _) in self.figures.items()},
                          calls={k: call for k, (_, _, call) in self.figures.items()})


def learn_links(traces: Sequence[Trace], cluster: Cluster) -> LearnedLinks | None:
    """The link figures `traces` (timed, run on `cluster`) imply; None where they hold no
    timed communication the fit can use."""
    samples = [s for t in traces for s in observe(t)[0]]
    if not samples:
        return None
    calls = call_costs(cluster)
    base = {kind: (bw, lat, calls.get(kind, 0.0))
            for kind, (bw, lat) in link_figures(cluster).items()}
    try:
        fit = fit_links(samples, cluster, base=base)
    except ConfigError:  # nothing the lowering can time (e.g. communication of size 0)
        return None
    figures, unidentified = {}, []
    for e in fit.links:
        values = (e.bandwidth_Bps, e.latency_s, e.call_s)
        if not all(math.isfinite(v) and v >= 0 for v in values) or e.bandwidth_Bps <= 0:
            continue
        figures[e.kind] = values
        unidentified += [f"{e.kind} {what}" for what, why in (
            ("latency", e.latency_unidentified), ("bandwidth", e.bandwidth_unidentified),
            ("call cost", e.call_unidentified)) if why is not None]
    if not figures:
        return None
    return LearnedLinks(figures, cluster.accelerator.name, len(fit.residuals),
                        tuple(unidentified), fit.rms_error)
