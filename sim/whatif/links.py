"""What the capture says about communication: calibrate's link fit over its own measured
collectives and transfers, to time the target's communication on the capture's kind of cluster.

    links = learn_links(captured.traces, capture_cluster)
    cluster = links.applied_to(target_cluster)

A cluster's default link figures are a data sheet's (`localhost`: tens of µs), while the
capture's own communication says what a call really costs on the machine it ran on (gloo on a
shared CPU host: milliseconds). `sim.calibrate.links.fit_links` fits each link class's latency,
bandwidth and per-call cost to the capture's `sim.calibrate.observe` samples and to the
all-reduces `parasim run` times at four sizes after its steps (`executor.probe`, the
header's `host_probe`: `probe_samples`), which pin the call apart from the bytes. Where the
fit pins no figure down at all, the latency stays the cluster's: one group's all-reduces (the
probe's) pay latency and call cost alike, once per call, so no sizes tell the two apart, but
several sizes pin their sum apart from the bytes, and the call cost and the bandwidth are
fitted to the sizes' means (`_held`). Where only one size was measured (a capture without
the probe: a DP one holds one gradient all-reduce), the call cost stays the cluster's too and
only the bandwidth is fitted: a per-call cost of milliseconds, read off one large
all-reduce, charged to each of a TP job's hundreds of small ones would multiply its step
(the bench's DP 2 -> TP 2 pair: +215%). The figures left unpinned are listed.

Where the target runs an all-reduce the probe measured exactly (the same size, over as many
ranks on the same link classes as the probe's world group), it takes that size's mean from
the probe, not the fitted figures (`ProbeMeans`), as the kernel book times a shape the capture
ran: a gloo call on a time-shared host is bimodal, its own time or a scheduler tick more, and
the tick's chance grows with the bytes (docs/whatif.md, "Where a TP 2 step's time goes"),
which latency + bytes / bandwidth cannot express.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sim.calibrate.links import LinkFit, _Design, _rows, fit_links
from sim.calibrate.observe import CommSample, observe
from sim.collectives import Algorithm
from topology.cluster import Cluster
from topology.override import call_costs, link_figures, with_links
from traces.errors import ConfigError
from traces.ops import Op, OpKind, Trace


@dataclass(frozen=True, slots=True)
class ProbeMeans:
    """The probe's all-reduces, each size's mean over all its calls (`executor.probe`: the
    expected cost of a call, what a step of many pays per call)."""

    ranks: int
    """The probe's world: its group is ranks 0..ranks-1 of the capture's cluster."""
    links: frozenset[str]
    """The link classes that group's members reach each other over (`group_links`)."""
    means: tuple[tuple[float, float], ...]
    """(bytes, mean seconds) per probed size, ascending."""

    def seconds(self, op: Op, cluster: Cluster) -> float | None:
        """The measured mean for `op` on `cluster` where the probe ran it exactly: an
        all-reduce of a probed size over a group of the probe's size whose members reach each
        other over the probe's link classes; None (the fit times it) otherwise."""
        if op.kind is not OpKind.ALL_REDUCE or len(op.group) != self.ranks:
            return None
        mean = dict(self.means).get(float(op.size_bytes))
        if mean is None or group_links(cluster, op.group) != self.links:
            return None
        return mean


def group_links(cluster: Cluster, group: Sequence[int]) -> frozenset[str]:
    """The link classes on the routes between every two members of `group`."""
    return frozenset(cluster.link_kind[link] for a in group for b in group if a != b
                     for link in cluster.route(a, b))


def probe_means(traces: Sequence[Trace], cluster: Cluster) -> ProbeMeans | None:
    """Each probed size's mean over the calls of every capture's probe (`probe_samples`;
    repeated captures are pooled, as their kernels are); None where no capture was probed,
    or their probes' worlds differ or do not fit on `cluster`."""
    probes = [t.meta.host_probe for t in traces if t.meta.host_probe is not None]
    worlds = {p.get("ranks") for p in probes}
    if not probes or len(worlds) != 1:
        return None
    (ranks,) = worlds
    if not isinstance(ranks, int) or not 2 <= ranks <= cluster.num_devices:
        return None
    calls: dict[float, list[float]] = {}
    for t in traces:
        for s in probe_samples(t):
            calls.setdefault(s.size_bytes, []).append(s.seconds)
    means = tuple((size, statistics.fmean(times)) for size, times in sorted(calls.items()))
    return ProbeMeans(ranks, group_links(cluster, range(ranks)), means)


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
    probe: ProbeMeans | None = None
    """The probe's sizes, measured: they time the target's all-reduces of those sizes on
    the probe's kind of group (`ProbeMeans.seconds`)."""

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
    samples = [s for t in traces for s in (*observe(t)[0], *probe_samples(t))]
    if not samples:
        return None
    calls = call_costs(cluster)
    base = {kind: (bw, lat, calls.get(kind, 0.0))
            for kind, (bw, lat) in link_figures(cluster).items()}
    try:
        fit = fit_links(samples, cluster, base=base)
    except ConfigError:  # nothing the lowering can time (e.g. communication of size 0)
        return None
    if all(e.latency_unidentified and e.bandwidth_unidentified and e.call_unidentified
           for e in fit.links):
        fit = _held(fit, samples, cluster, base, hold_call=False) or \
            _held(fit, samples, cluster, base, hold_call=True) or fit
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
                        tuple(unidentified), fit.rms_error, probe_means(traces, cluster))


def probe_samples(trace: Trace) -> list[CommSample]:
    """The all-reduces `parasim run` timed after its steps at a few sizes (`executor.probe`,
    the header's `host_probe`), as samples of the world group's communication."""
    probe = trace.meta.host_probe
    if probe is None:
        return []
    ranks, rows = probe.get("ranks"), probe.get("samples")
    if probe.get("collective") != "all_reduce" or not isinstance(ranks, int) or ranks < 1 \
            or not isinstance(rows, list) or not all(_sample(r) for r in rows):
        raise ConfigError("trace: meta.host_probe: not an all-reduce probe of parasim run "
                          "(collective, ranks, samples [[bytes, seconds], ...])")
    group = tuple(range(ranks))
    return [CommSample(OpKind.ALL_REDUCE, group, float(b), float(t)) for b, t in rows]


def _sample(row: object) -> bool:
    """[bytes, seconds], both positive numbers."""
    return isinstance(row, list) and len(row) == 2 and all(
        isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in row)


def _held(fit: LinkFit, samples: Sequence[CommSample], cluster: Cluster,
          base: dict[str, tuple[float, float, float]], hold_call: bool) -> LinkFit | None:
    """`fit` with each class's latency held at `base` and the rest least squares fitted to
    the samples' means (the times are linear in 1/bandwidth and the call cost:
    `_Design.matrix`): the per-call cost and the bandwidth, or (`hold_call`) the bandwidth
    alone, its call cost held too. None where the samples do not pin the free figures down
    (fewer distinct sizes than figures) or a figure comes out unphysical.

    Why not give up on the call cost: one group's all-reduces pay latency and call cost
    alike, once per call, so no set of sizes on it tells the two apart and the full fit calls
    all three figures unidentified; the probe's sizes still pin their sum apart from the
    bytes, and that sum is what a TP step's many small calls pay (docs/whatif.md)."""
    rows = _rows(samples)
    design = _Design(cluster, rows, Algorithm.AUTO)
    c, a = design.matrix()
    k = len(design.kinds)
    figures = [base.get(kind, (0.0, 0.0, 0.0)) for kind in design.kinds]
    latency = np.array([f[1] for f in figures])
    call = np.array([f[2] for f in figures])
    free = a[:, k:2 * k] if hold_call else a[:, k:]
    rest = np.array([r.seconds for r in rows]) - c - a[:, :k] @ latency
    if hold_call:
        rest = rest - a[:, 2 * k:] @ call
    if np.linalg.matrix_rank(free) < free.shape[1]:
        return None
    solved = np.linalg.lstsq(free, rest, rcond=None)[0]
    if not (np.all(solved[:k] > 0) and np.all(solved[k:] >= 0)):
        return None
    links = []
    for e in fit.links:
        if e.kind not in design.kinds:
            continue
        j = design.kinds.index(e.kind)
        links.append(replace(e, latency_s=latency[j], bandwidth_Bps=1.0 / solved[j],
                             bandwidth_unidentified=None,
                             call_s=call[j] if hold_call else solved[k + j],
                             call_unidentified=e.call_unidentified if hold_call else None))
    return replace(fit, links=tuple(links))
