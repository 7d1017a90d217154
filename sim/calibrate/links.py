"""Fitting link classes: latency and bandwidth per link `kind`, from communication samples, with
the simulator's own lowerings as the design: T = c + Σ a_k·latency_k + Σ b_k/bandwidth_k +
Σ d_k·call_k, the coefficients read off the simulator by timing each lowering on basis copies of
the cluster, solved by bounded least squares in relative terms on each communication's mean.
A figure the data do not pin down carries the reason (`LinkEstimate.latency_unidentified`, ...).

The method in full: docs/calibration.md ("Links").
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from sim.calibrate.observe import CommSample
from sim.collectives import Algorithm, Collectives, analytic_time
from sim.engine.flows import Lowering
from topology.cluster import Cluster
from topology.override import link_figures, with_links
from traces.errors import ConfigError
from traces.fields import MAX_BANDWIDTH_BPS, MAX_LATENCY_S, MIN_BANDWIDTH_BPS
from traces.ops import OpKind

BOUND_MARGIN = 0.01
"""A figure within 1% of a limit of its search went there because the data never felt it."""
UNBOUNDED_BPS = 1e300  # a basis bandwidth no flow notices (finite: the network asserts it)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkEstimate:
    kind: str
    latency_s: float
    latency_ci_s: tuple[float, float]
    bandwidth_Bps: float
    bandwidth_ci_Bps: tuple[float, float]
    call_s: float = 0.0
    """Per collective call, before any message moves (`LinkParams.call_s`)."""
    call_ci_s: tuple[float, float] = (0.0, 0.0)
    latency_unidentified: str | None = None
    """Why the data do not pin the latency down (None: they do)."""
    bandwidth_unidentified: str | None = None
    call_unidentified: str | None = None
    """Also set where no lowering measured pays a call cost ("not measured")."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Residual:
    """Measured against fitted time of one distinct communication."""

    op: str
    group_size: int
    size_bytes: float
    measured_s: float
    fitted_s: float
    samples: int

    @property
    def error(self) -> float:
        return (self.fitted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkFit:
    links: tuple[LinkEstimate, ...]
    residuals: tuple[Residual, ...]
    algorithms: dict[str, str]
    """The lowering each op kind was fitted with (e.g. all_reduce -> gloo)."""

    @property
    def rms_error(self) -> float:
        errors = [r.error for r in self.residuals]
        return math.sqrt(statistics.fmean(e * e for e in errors)) if errors else 0.0


@dataclass(frozen=True, slots=True)
class _Row:
    kind: OpKind
    group: tuple[int, ...]
    size: float
    seconds: float
    count: int


def _rows(samples: Sequence[CommSample]) -> list[_Row]:
    grouped: dict[tuple[OpKind, tuple[int, ...], float], list[float]] = defaultdict(list)
    for s in samples:
        grouped[(s.kind, s.group, s.size_bytes)].append(s.seconds)
    return [_Row(k, g, size, statistics.fmean(v), len(v))
            for (k, g, size), v in sorted(grouped.items(), key=lambda kv: (str(kv[0][0]),
                                                                             kv[0][1:]))]


class _Design:
    """Times of the rows' lowerings on basis copies of the cluster."""

    def __init__(self, cluster: Cluster, rows: list[_Row], algo: Algorithm) -> None:
        self.cluster, self.rows = cluster, rows
        chooser = Collectives(cluster)
        self.names = ["p2p" if r.kind.is_p2p else
                      chooser.resolve(r.kind, r.group, r.size, algo)[0] for r in rows]
        used: set[str] = set()
        for row, name in zip(rows, self.names):
            for rnd in self._lowering(chooser, row, name):
                for flows, _ in rnd:
                    used.update(cluster.link_kind[link] for link in flows.links)
        self.kinds = sorted(used)

    def _lowering(self, collectives: Collectives, row: _Row, name: str) -> Lowering:
        if row.kind.is_p2p:
            return collectives.p2p(*row.group)
        # An NCCL choice ("ring/LL128") gives its algorithm's flows, its protocol left out.
        lowering = collectives.lowering(row.kind, row.group, name)
        assert lowering is not None, f"{name} applies to {row.kind} on {row.group}"
        return lowering

    def times(self, latency: dict[str, float], bandwidth: dict[str, float],
              call: dict[str, float]) -> np.ndarray:
        figures = {k: (bandwidth.get(k, UNBOUNDED_BPS), latency.get(k, 0.0))
                   for k in set(self.cluster.link_kind)}
        basis = with_links(self.cluster, figures,
                           calls={k: call.get(k, 0.0) for k in set(self.cluster.link_kind)})
        collectives = Collectives(basis)
        return np.array([analytic_time(basis, self._lowering(collectives, row, name), row.size)
                         for row, name in zip(self.rows, self.names)])

    def matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """(c, A): times = c + A @ [latency_k..., 1/bandwidth_k..., call_k...]."""
        c = self.times({}, {}, {})
        columns = [self.times({k: 1.0}, {}, {}) - c for k in self.kinds]
        columns += [self.times({}, {k: 1.0}, {}) - c for k in self.kinds]
        columns += [self.times({}, {}, {k: 1.0}) - c for k in self.kinds]
        return c, np.stack(columns, axis=1)


def fit_links(samples: Sequence[CommSample], cluster: Cluster, *,
              algo: Algorithm = Algorithm.AUTO,
              confidence: float = 0.95,
              base: Mapping[str, tuple[float, float, float]] | None = None) -> LinkFit:
    """Latency, bandwidth and per-call cost of every link class the samples' communication
    crosses (a call cost only where some lowering pays one: gloo's collectives). Figures the
    data do not pin down are held at `base` (kind -> bandwidth, latency, call cost) where it
    names their class, and the others fitted again beside them."""
    rows = _rows(samples)
    if not rows:
        raise ConfigError("calibrate: the traces hold no timed communication to fit links to")
    design = _Design(cluster, rows, algo)
    c, a = design.matrix()
    measured = np.array([r.seconds for r in rows])
    k = len(design.kinds)
    start = link_figures(cluster)
    # Unknowns scaled by the cluster's own figures, so the columns are of one magnitude.
    scale = np.array([max(start.get(kind, (1e9, 1e-5))[1], 1e-7) for kind in design.kinds]
                     + [1.0 / start.get(kind, (1e9, 1e-5))[0] for kind in design.kinds]
                     + [1e-4] * k)
    lower = np.concatenate([np.zeros(k), np.full(k, 1 / MAX_BANDWIDTH_BPS), np.zeros(k)])
    upper = np.concatenate([np.full(k, MAX_LATENCY_S), np.full(k, 1 / MIN_BANDWIDTH_BPS),
                            np.full(k, MAX_LATENCY_S)])
    # Fit only what some row depends on (no gloo collective: no call cost to fit).
    free = [int(j) for j in np.flatnonzero(np.abs(a).max(axis=0) > 0)]
    zlo, zhi = lower / scale, upper / scale

    def solve(unknown: list[int], fixed: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
        """Figures (unscaled) and half-widths with `fixed` figures held at their values."""
        x = np.zeros(3 * k)
        half = np.zeros(3 * k)
        for j, value in fixed.items():
            x[j] = value
        target = (measured - c - a @ x) / measured
        if not unknown:
            return x, half
        weighted = a[:, unknown] * scale[unknown] / measured[:, None]
        lo, hi = zlo[unknown], zhi[unknown]
        # Linear in the unknowns; a soft-L1 loss so that the odd size a slow spell spoiled in
        # every repeat weighs as a 10% error, not as its square.
        x0 = np.clip(np.ones(len(unknown)), lo + 1e-12, hi * (1 - 1e-9))
        solved = optimize.least_squares(lambda z: weighted @ z - target, x0,
                                        jac=lambda z: weighted, bounds=(lo, hi),
                                        loss="soft_l1", f_scale=0.1, x_scale="jac",
                                        xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=10000)
        x[unknown] = solved.x * scale[unknown]
        half[unknown] = _half_widths(weighted, target - weighted @ solved.x,
                                     confidence) * scale[unknown]
        return x, half

    def reasons(x: np.ndarray, half: np.ndarray, unknown: list[int]) -> dict[int, str]:
        """Why each figure of `unknown` is not identified (absent: it is). Latency and call
        cost may be 0 (a physical value the data can choose); the other bounds are the
        search's limits."""
        out: dict[int, str] = {}
        short = (f"{len(rows)} distinct communications measured for {len(unknown)} link "
                 "figures (an interval needs more)") if len(rows) <= len(unknown) else None
        for j in unknown:
            z = x[j] / scale[j]
            what = (f"{MIN_BANDWIDTH_BPS / 1e9:g} to {MAX_BANDWIDTH_BPS / 1e9:g} GB/s"
                    if k <= j < 2 * k else f"0 to {MAX_LATENCY_S:g} s")
            if short:
                out[j] = short
            elif k <= j < 2 * k and z <= zlo[j] * (1 + BOUND_MARGIN):
                out[j] = f"at the upper bound of its search ({what})"
            elif z >= zhi[j] * (1 - BOUND_MARGIN):
                out[j] = (f"at the {'lower' if k <= j < 2 * k else 'upper'} bound of its "
                          f"search ({what})")
            elif not math.isfinite(half[j]):
                out[j] = "the data do not constrain it (no interval)"
        return out

    x, half = solve(free, {})
    why = reasons(x, half, free)
    if why and base is not None:
        # Hold what the data leave free at the base's figures and fit the rest again, so the
        # figures written are consistent with each other (a latency fitted beside an
        # unbounded bandwidth is not the latency beside the base's bandwidth).
        held = {}
        for j in why:
            figures = base.get(design.kinds[j % k])
            if figures is not None:
                bw, lat, call = figures
                held[j] = (lat, 1.0 / bw, call)[j // k]
        rest = [j for j in free if j not in held]
        if held and rest:
            x, half = solve(rest, held)
            why = {**{j: why[j] for j in held}, **reasons(x, half, rest)}
    for j in range(3 * k):
        if j not in free:
            why[j] = "not measured (no lowering of the traces pays it)"
    fitted = c + a @ x

    links = []
    for i, kind in enumerate(design.kinds):
        lat, inv, call = x[i], x[k + i], x[2 * k + i]
        dl, di, dc = half[i], half[k + i], half[2 * k + i]
        links.append(LinkEstimate(
            latency_unidentified=why.get(i), bandwidth_unidentified=why.get(k + i),
            call_unidentified=why.get(2 * k + i),
            kind=kind, latency_s=float(lat),
            latency_ci_s=(float(max(0.0, lat - dl)), float(lat + dl)),
            bandwidth_Bps=float(1 / inv),
            bandwidth_ci_Bps=(float(1 / (inv + di)),
                              float(1 / (inv - di)) if inv > di else math.inf),
            call_s=float(call), call_ci_s=(float(max(0.0, call - dc)), float(call + dc))))
    residuals = tuple(Residual(op=str(r.kind), group_size=len(r.group), size_bytes=r.size,
                               measured_s=r.seconds, fitted_s=float(f), samples=r.count)
                      for r, f in zip(rows, fitted))
    algorithms = {str(r.kind): name for r, name in zip(rows, design.names)}
    return LinkFit(links=tuple(links), residuals=residuals, algorithms=algorithms)


def _half_widths(design: np.ndarray, residual: np.ndarray, confidence: float) -> np.ndarray:
    """Half-widths of the confidence intervals of a least-squares solution."""
    n, p = design.shape
    if n <= p:
        return np.full(p, math.inf)
    variance = float(residual @ residual) / (n - p)
    try:
        cov = np.linalg.inv(design.T @ design) * variance
    except np.linalg.LinAlgError:
        return np.full(p, math.inf)
    t = float(stats.t.ppf(0.5 + confidence / 2, n - p))
    return t * np.sqrt(np.maximum(np.diag(cov), 0.0))
