"""From timed traces to a calibrated profile: the link fit and the compute fit, put together.

    profile, report = fit_profile([trace, ...], cluster, base=default_profile(accel))

Traces of any origin count (microbenchmarks, `parasim run`, imported ones): each timed op is a
sample (`sim.calibrate.observe`). Link classes without samples keep the cluster's figures (none
are written for them); kernels without samples keep the base profile's general parameters.
Figures the data do not pin down (`sim.calibrate.links`, `sim.calibrate.kernels`: too few
points, at a limit of the search, no interval) are not written as calibrated: the base
profile's value stays, and the report says which and why (`FitReport.unidentified`). The
`comm_interference` is measured by the microbenchmarks' interference probes
(`sim.calibrate.interference`); traces without them keep the base's. The profile says
`calibrated: true`, `measured_on` the cluster's accelerator, and carries what the
fit could not set (the GEMM tiles) from `base`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sim.calibrate.interference import InterferenceFit, fit_interference
from sim.calibrate.kernels import ComputeFit, fit_compute
from sim.calibrate.links import LinkFit, fit_links
from sim.calibrate.observe import CommSample, ComputeSample, observe
from sim.collectives import Algorithm
from sim.profile import (
    AcceleratorRoofs,
    ComputeParams,
    KernelCost,
    LinkParams,
    Profile,
)
from topology.cluster import Accelerator, Cluster
from topology.override import call_costs, link_figures
from traces.errors import ConfigError
from traces.fields import MAX_LATENCY_S, MIN_EFFICIENCY
from traces.ops import Trace

MEASURED_ROOFS = ("CPU-localhost",)
"""Accelerators whose roofs are measured, not read from a data sheet."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FitReport:
    links: LinkFit | None
    compute: ComputeFit | None
    num_comm_samples: int
    num_compute_samples: int
    unidentified: tuple[str, ...] = ()
    """One line per figure the data did not pin down (the base profile's value was kept)."""
    interference: InterferenceFit | None = None
    """comm_interference: kernels beside communication."""
    compute_interference: InterferenceFit | None = None
    """compute_interference: communication beside kernels."""
    compute_interference_delay: InterferenceFit | None = None
    """compute_interference_delay_s: communication's wait for a core beside kernels."""


def fit_profile(traces: Sequence[Trace], cluster: Cluster, *, base: Profile,
                name: str = "calibrated",
                algo: Algorithm = Algorithm.AUTO) -> tuple[Profile, FitReport]:
    """Fit links and compute to the traces' timed ops; the profile and what the fit found.
    Figures the data do not pin down keep the base profile's values (listed in the report);
    if no figure at all is pinned down, one error line."""
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
    links = fit_links(comm, cluster, algo=algo, base=_base_links(cluster, base)) \
        if comm else None
    kernels = fit_compute(compute, cluster.accelerator, base.compute.gemm_tiles, base) \
        if compute else None
    notes: list[str] = []
    link_params, num_links = _link_params(links, cluster, base, notes)
    accelerator, params, num_compute = _compute_params(kernels, cluster.accelerator, base,
                                                       notes)
    interference, slow_comm, wait = fit_interference(
        traces, delay_s=base.compute.compute_interference_delay_s)
    for figure, found in (("comm_interference", interference),
                          ("compute_interference", slow_comm),
                          ("compute_interference_delay_s", wait)):
        if found is None:
            continue
        if found.unidentified is None:
            params = dataclasses.replace(params, **{figure: found.value})  # type: ignore[arg-type]
            num_compute += 1
        else:
            _kept(notes, figure, found.unidentified)
    if num_links + num_compute == 0:
        raise ConfigError("calibrate: the traces pin down no figure: "
                          + "; ".join(notes[:3]) + ("; ..." if len(notes) > 3 else ""))
    profile = Profile(
        name=name, calibrated=True, compute=params, accelerator=accelerator,
        links={**base.links, **link_params}, measured_on=cluster.accelerator.name,
        measured_ranks=len({r for t in traces for r in t.ranks}))  # per-rank files: all
    return profile, FitReport(links=links, compute=kernels, num_comm_samples=len(comm),
                              num_compute_samples=len(compute), unidentified=tuple(notes),
                              interference=interference, compute_interference=slow_comm,
                              compute_interference_delay=wait)


def _kept(notes: list[str], figure: str, reason: str | None) -> None:
    """Note a figure the data did not pin down (`reason`; None: they did), whose base
    value the profile keeps."""
    if reason:
        notes.append(f"{figure} not identifiable: {reason}; kept the base profile's value")


def _base_links(cluster: Cluster, base: Profile) -> dict[str, tuple[float, float, float]]:
    """Each link class's figures before the fit (bandwidth, latency, call cost): the base
    profile's, else the cluster's."""
    calls = call_costs(cluster)
    out = {kind: (bw, lat, calls.get(kind, 0.0)) for kind, (bw, lat) in
           link_figures(cluster).items()}
    out.update({kind: (p.bandwidth_Bps, p.latency_s, p.call_s) for kind, p in base.links.items()})
    return out


def _link_params(fit: LinkFit | None, cluster: Cluster, base: Profile, notes: list[str]
                 ) -> tuple[dict[str, LinkParams], int]:
    """Link classes with their identified figures (the others the base's, else the
    cluster's: `fit_links` held them there), and how many figures were identified."""
    if fit is None:
        return {}, 0
    figures = _base_links(cluster, base)
    out: dict[str, LinkParams] = {}
    count = 0
    for e in fit.links:
        bw0, lat0, call0 = figures.get(e.kind, (e.bandwidth_Bps, e.latency_s, e.call_s))
        values = []
        for what, value, default, reason in (
                ("latency", e.latency_s, lat0, e.latency_unidentified),
                ("bandwidth", e.bandwidth_Bps, bw0, e.bandwidth_unidentified),
                ("call cost", e.call_s, call0, e.call_unidentified)):
            if reason is None:
                count += 1
                values.append(value)
                continue
            values.append(default)
            if not reason.startswith("not measured"):
                _kept(notes, f"link {e.kind} {what}", reason)
        if any(r is None for r in (e.latency_unidentified, e.bandwidth_unidentified,
                                   e.call_unidentified)):
            out[e.kind] = LinkParams(latency_s=values[0], bandwidth_Bps=values[1],
                                     call_s=values[2])
    return out, count


def _compute_params(fit: ComputeFit | None, acc: Accelerator, base_profile: Profile,
                    notes: list[str]) -> tuple[AcceleratorRoofs | None, ComputeParams, int]:
    """Efficiencies relative to the roofs: the data sheet's, or measured ones — the best
    identified rate — where there is no data sheet or an identified rate beats it. A rate
    above its roof is the roof (efficiency 1). Figures the data do not pin down keep the
    base's values (a note each); the count of identified figures comes third."""
    base = base_profile.compute
    if fit is None:
        return base_profile.accelerator, base, 0
    for k in fit.kernels:
        kind = "FLOP rate" if k.flops_rate is not None else "memory rate"
        _kept(notes, f"kernel {k.name} {kind}", k.rate_unidentified)
        _kept(notes, f"kernel {k.name} overhead", k.overhead_unidentified)
    _kept(notes, "compute memory rate", fit.memory_rate_unidentified)
    _kept(notes, "roofline exponent", fit.exponent_unidentified)
    # Roofs from the rates pinned down within ±50%; efficiencies for every identified rate.
    flops = [k.flops_rate for k in fit.kernels if k.flops_rate is not None and k.sets_roof]
    memory = [k.memory_rate for k in fit.kernels if k.memory_rate is not None and k.sets_roof]
    roofs = base_profile.accelerator
    peak = roofs.peak_flops if roofs else acc.sustained_flops
    hbm = roofs.hbm_bandwidth_Bps if roofs else acc.sustained_hbm_Bps
    if (acc.name in MEASURED_ROOFS and (flops or memory)) or max(flops, default=0) > peak or \
            max(memory, default=0) > hbm:
        peak, hbm = max(flops, default=peak), max(memory, default=hbm)
        roofs = AcceleratorRoofs(peak_flops=peak, hbm_bandwidth_Bps=hbm)
    count = int(fit.memory_rate_unidentified is None)
    # A figure the data leave free was held at the base's (`fit_compute`): written as the
    # base's where that reads the same (its own override, or the general figure if that does
    # not move), else as the held value itself (relative to measured roofs).
    same_roofs = roofs == base_profile.accelerator
    gemm = [k.flops_rate for k in fit.kernels if k.flops_rate is not None and k.identified]
    overheads = [k.overhead_s for k in fit.kernels if k.overhead_unidentified is None]
    moves = {"flops": bool(gemm) or not same_roofs,
             "memory": fit.memory_rate_unidentified is None or not same_roofs,
             "overhead": bool(overheads)}
    kernels = {}
    for k in fit.kernels:
        was = base_profile.kernel(k.name)
        flops_eff, mem_eff, overhead = was.flops_efficiency, was.memory_efficiency, was.overhead_s
        if k.identified:
            count += 1
        if k.flops_rate is not None and (k.identified or not same_roofs or
                                         (flops_eff is None and moves["flops"])):
            flops_eff = _fraction(k.flops_rate / peak)
        if k.memory_rate is not None and (k.identified or not same_roofs or
                                          (mem_eff is None and moves["memory"])):
            mem_eff = _fraction(k.memory_rate / hbm)
        if k.overhead_unidentified is None:
            count += 1
        if k.overhead_unidentified is None or (overhead is None and moves["overhead"]):
            overhead = min(k.overhead_s, MAX_LATENCY_S)
        kernels[k.name] = KernelCost(flops_efficiency=flops_eff, memory_efficiency=mem_eff,
                                     overhead_s=overhead)
    exponent = base.roofline_exponent if fit.exponent_unidentified else fit.exponent
    count += fit.exponent_unidentified is None
    params = ComputeParams(
        gemm_efficiency=_fraction(statistics.median(gemm) / peak) if gemm
        else base.gemm_efficiency,
        gemm_tiles=base.gemm_tiles,
        memory_efficiency=base.memory_efficiency
        if fit.memory_rate_unidentified and same_roofs else _fraction(fit.memory_rate / hbm),
        launch_overhead_s=min(statistics.median(overheads), MAX_LATENCY_S) if overheads
        else base.launch_overhead_s,
        roofline_exponent=exponent, kernels=kernels,
        comm_interference=base.comm_interference,
        compute_interference=base.compute_interference,
        compute_interference_delay_s=base.compute_interference_delay_s)
    return roofs, params, count


def _fraction(value: float) -> float:
    """An efficiency in [MIN_EFFICIENCY, 1] (a rate a hair above its roof by rounding is the
    roof; one a million times under it is the floor a profile may hold)."""
    return min(1.0, max(value, MIN_EFFICIENCY))
