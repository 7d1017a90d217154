"""From timed traces to a calibrated profile: the link fit and the compute fit, put together.

    profile, report = fit_profile([trace, ...], cluster, base=default_profile(accel))

Traces of any origin count (microbenchmarks, `parasim run`, imported ones): each timed op is a
sample (`sim.calibrate.observe`). Link classes without samples keep the cluster's figures (none
are written for them); kernels without samples keep the base profile's general parameters. The
profile says `calibrated: true` and carries what the fit could not set (the GEMM tiles) from
`base`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sim.calibrate.kernels import ComputeFit, fit_compute
from sim.calibrate.links import LinkFit, fit_links
from sim.calibrate.observe import CommSample, ComputeSample, observe
from sim.profile import (
    AcceleratorRoofs,
    ComputeParams,
    KernelCost,
    LinkParams,
    Profile,
)
from topology.cluster import Accelerator, Cluster
from traces.errors import ConfigError
from traces.fields import MAX_BANDWIDTH_BPS, MAX_LATENCY_S, MAX_TFLOPS
from traces.ops import Trace

MEASURED_ROOFS = ("CPU-localhost",)
"""Accelerators whose roofs are measured, not read from a data sheet."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FitReport:
    links: LinkFit | None
    compute: ComputeFit | None
    num_comm_samples: int
    num_compute_samples: int


def fit_profile(traces: Sequence[Trace], cluster: Cluster, *, base: Profile,
                name: str = "calibrated", algo: str = "auto") -> tuple[Profile, FitReport]:
    """Fit links and compute to the traces' timed ops; the profile and what the fit found."""
    comm: list[CommSample] = []
    compute: list[ComputeSample] = []
    for trace in traces:
        c, k = observe(trace)
        comm += c
        compute += k
    if not comm and not compute:
        raise ConfigError("calibrate: the traces hold no timed ops (a plan, or a failed run?)")
    for s in comm:
        if max(s.group) >= cluster.num_devices:
            raise ConfigError(f"calibrate: the traces use rank {max(s.group)} but the cluster "
                              f"{cluster.name} has {cluster.num_devices} accelerators")
    links = fit_links(comm, cluster, algo=algo) if comm else None
    kernels = fit_compute(compute, cluster.accelerator, base.compute.gemm_tiles) \
        if compute else None
    accelerator, params = _compute_params(kernels, cluster.accelerator, base.compute)
    profile = Profile(
        name=name, calibrated=True, compute=params, accelerator=accelerator,
        links={**base.links, **({e.kind: LinkParams(bandwidth_Bps=e.bandwidth_Bps,
                                                    latency_s=e.latency_s, call_s=e.call_s)
                                 for e in links.links} if links else {})})
    return profile, FitReport(links=links, compute=kernels, num_comm_samples=len(comm),
                              num_compute_samples=len(compute))


def _compute_params(fit: ComputeFit | None, acc: Accelerator, base: ComputeParams
                    ) -> tuple[AcceleratorRoofs | None, ComputeParams]:
    """Efficiencies relative to the roofs: the data sheet's, or measured ones — the best rate
    the data pin down (else the best fitted) — where there is no data sheet or a fitted rate
    beats it. A rate above its roof is the roof (efficiency 1): a rate the data leave free
    went to its bound because its term was negligible wherever it was measured."""
    if fit is None:
        return None, base
    flops = _roof_candidates([(k.flops_rate, k.identified) for k in fit.kernels],
                             MAX_TFLOPS * 1e12)
    memory = _roof_candidates([(k.memory_rate, k.identified) for k in fit.kernels]
                              + [(fit.memory_rate, False)], MAX_BANDWIDTH_BPS)
    peak, hbm = acc.peak_flops, acc.hbm_bandwidth_Bps
    measured = acc.name in MEASURED_ROOFS or max(flops, default=0) > peak or \
        max(memory, default=0) > hbm
    roofs = None
    if measured:
        peak, hbm = max(flops, default=peak), max(memory, default=hbm)
        roofs = AcceleratorRoofs(peak_flops=peak, hbm_bandwidth_Bps=hbm)
    gemm = [k.flops_rate / peak for k in fit.kernels if k.flops_rate is not None]
    overheads = [k.overhead_s for k in fit.kernels]
    kernels = {k.name: KernelCost(
        flops_efficiency=_fraction(k.flops_rate / peak) if k.flops_rate is not None else None,
        memory_efficiency=_fraction(k.memory_rate / hbm) if k.memory_rate is not None else None,
        overhead_s=min(k.overhead_s, MAX_LATENCY_S)) for k in fit.kernels}
    params = ComputeParams(
        gemm_efficiency=_fraction(statistics.median(gemm)) if gemm else base.gemm_efficiency,
        gemm_tiles=base.gemm_tiles,
        memory_efficiency=_fraction(fit.memory_rate / hbm),
        launch_overhead_s=min(statistics.median(overheads), MAX_LATENCY_S),
        roofline_exponent=fit.exponent, kernels=kernels,
        comm_interference=base.comm_interference)
    return roofs, params


def _roof_candidates(rates: list[tuple[float | None, bool]], bound: float) -> list[float]:
    """The rates a measured roof may be: those the data pin down, else any off its bound."""
    known = [r for r, identified in rates if r is not None and identified]
    return known or [r for r, _ in rates if r is not None and r < 0.999 * bound]


def _fraction(value: float) -> float:
    """An efficiency in (0, 1] (a rate a hair above its roof by rounding is the roof)."""
    return min(1.0, max(value, 1e-9))
