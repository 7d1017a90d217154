"""What `parasim calibrate` prints: the fitted figures with their intervals and residuals, as
one JSON object (`--json`) or a table."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sim.profile import Profile

if TYPE_CHECKING:
    from sim.calibrate.fit import FitReport
    from sim.calibrate.interference import InterferenceFit
    from sim.calibrate.microbench import Target


def summary_json(profile: Profile, report: FitReport, target: Target, out: str
                 ) -> dict[str, Any]:
    links = report.links
    compute = report.compute
    return {
        "profile": out,
        "name": profile.name,
        "cluster": target.cluster.name,
        "ranks": target.world,
        "samples": {"communication": report.num_comm_samples,
                    "compute": report.num_compute_samples},
        "links": [] if links is None else [
            {"kind": e.kind, "latency_s": e.latency_s, "latency_ci_s": list(e.latency_ci_s),
             "bandwidth_Bps": e.bandwidth_Bps,
             "bandwidth_ci_Bps": [e.bandwidth_ci_Bps[0], _finite(e.bandwidth_ci_Bps[1])],
             "call_s": e.call_s, "call_ci_s": list(e.call_ci_s),
             "identified": {"latency": e.latency_unidentified is None,
                            "bandwidth": e.bandwidth_unidentified is None,
                            "call": e.call_unidentified is None}}
            for e in links.links],
        "link_rms_error": None if links is None else links.rms_error,
        "link_algorithms": {} if links is None else links.algorithms,
        "link_residuals": [] if links is None else [
            {"op": r.op, "group_size": r.group_size, "size_bytes": r.size_bytes,
             "measured_s": r.measured_s, "fitted_s": r.fitted_s, "error": r.error}
            for r in links.residuals],
        "compute": None if compute is None else {
            "rms_error": compute.rms_error, "roofline_exponent": compute.exponent,
            "memory_rate_Bps": compute.memory_rate, "distinct_kernels": compute.distinct,
            "identified": {"roofline_exponent": compute.exponent_unidentified is None,
                           "memory_rate": compute.memory_rate_unidentified is None},
            "kernels": [{"name": k.name, "flops_rate": k.flops_rate,
                         "memory_rate_Bps": k.memory_rate, "overhead_s": k.overhead_s,
                         "rate_ci_rel": _finite(k.rel_ci), "samples": k.samples,
                         "rms_error": k.rms_error, "rate_identified": k.identified,
                         "overhead_identified": k.overhead_unidentified is None}
                        for k in compute.kernels]},
        "unidentified": list(report.unidentified),
        "comm_interference": _interference(report.interference),
        "compute_interference": _interference(report.compute_interference),
        "compute_interference_delay": _interference(report.compute_interference_delay),
        "accelerator": None if profile.accelerator is None else {
            "peak_flops": profile.accelerator.peak_flops,
            "hbm_bandwidth_Bps": profile.accelerator.hbm_bandwidth_Bps},
    }


def _interference(fit: InterferenceFit | None) -> dict[str, Any] | None:
    if fit is None:
        return None
    return {"value": _finite(fit.value), "ci": [_finite(x) for x in fit.ci],
            "alone_s": _finite(fit.alone_s), "overlapped_s": _finite(fit.overlapped_s),
            "num_alone": fit.num_alone, "num_overlapped": fit.num_overlapped,
            "num_outlived": fit.num_outlived, "identified": fit.unidentified is None}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def summary_text(s: dict[str, Any]) -> str:
    lines = [f"parasim calibrate: {s['name']} on {s['cluster']} ({s['ranks']} ranks), "
             f"{s['samples']['communication']} communications and "
             f"{s['samples']['compute']} kernels timed"]
    free = " (free: the base's written)"
    for e in s["links"]:
        lo, hi = e["bandwidth_ci_Bps"]
        ok = e["identified"]
        lines.append(
            f"  link {e['kind']:<10} latency {e['latency_s'] * 1e6:.2f} us "
            f"[{e['latency_ci_s'][0] * 1e6:.2f}, {e['latency_ci_s'][1] * 1e6:.2f}]"
            f"{'' if ok['latency'] else free}   "
            f"bandwidth {e['bandwidth_Bps'] / 1e9:.3g} GB/s [{lo / 1e9:.3g}, "
            f"{'inf' if hi is None else f'{hi / 1e9:.3g}'}]{'' if ok['bandwidth'] else free}"
            + (f"   per call {e['call_s'] * 1e6:.1f} us [{e['call_ci_s'][0] * 1e6:.1f}, "
               f"{e['call_ci_s'][1] * 1e6:.1f}]{'' if ok['call'] else free}"
               if e["call_s"] else ""))
    if s["link_rms_error"] is not None:
        algos = ", ".join(f"{k} {v}" for k, v in s["link_algorithms"].items())
        worst = max(s["link_residuals"], key=lambda r: abs(r["error"]))
        lines.append(f"  links fit: rms error {s['link_rms_error']:.1%} over "
                     f"{len(s['link_residuals'])} sizes ({algos}); worst {worst['op']} of "
                     f"{worst['size_bytes']:.0f} B: {worst['error']:+.1%}")
    c = s["compute"]
    if c is not None:
        ok = c["identified"]
        lines.append(f"  compute fit: rms error {c['rms_error']:.1%} over "
                     f"{c['distinct_kernels']} kernel shapes, roofline p = "
                     f"{c['roofline_exponent']:.2f}{'' if ok['roofline_exponent'] else free}, "
                     f"memory {c['memory_rate_Bps'] / 1e9:.3g} GB/s"
                     f"{'' if ok['memory_rate'] else free}")
        lines.append("    kernel           GFLOP/s   GB/s   overhead us  ±rate   rms   (free: not "
                     "pinned down by the data, the base profile's value written)")
        for k in c["kernels"]:
            rate = f"{k['flops_rate'] / 1e9:9.3g}" if k["flops_rate"] else f"{'':9}"
            mem = f"{k['memory_rate_Bps'] / 1e9:7.3g}" if k["memory_rate_Bps"] else f"{'':7}"
            ci = f"{k['rate_ci_rel']:6.1%}" if k["rate_identified"] else "  free"
            lines.append(f"    {k['name']:<15}{rate}{mem}  {k['overhead_s'] * 1e6:10.1f}  {ci}"
                         f"  {k['rms_error']:5.1%}")
    for key, what, beside, unit in (
            ("comm_interference", "a probe", "a collective", "probes"),
            ("compute_interference", "a collective", "kernels", "calls")):
        f = s[key]
        if f is not None and f["identified"]:
            lines.append(f"  {key.replace('_', ' ')} {f['value']:.3g} [{f['ci'][0]:.3g}, "
                         f"{f['ci'][1]:.3g}]: {what} took {f['alone_s'] * 1e6:.1f} us alone, "
                         f"{f['overlapped_s'] * 1e6:.1f} us beside {beside} "
                         f"({f['num_alone']} and {f['num_overlapped']} {unit})")
    f = s["compute_interference_delay"]
    if f is not None and f["identified"]:
        lines.append(f"  compute interference delay {f['value'] * 1e3:.3g} ms "
                     f"[{f['ci'][0] * 1e3:.3g}, {f['ci'][1] * 1e3:.3g}]: the smallest "
                     f"collective took {f['alone_s'] * 1e6:.1f} us alone, "
                     f"{f['overlapped_s'] * 1e6:.1f} us beside kernels")
    if s["accelerator"] is not None:
        a = s["accelerator"]
        lines.append(f"  measured roofs: {a['peak_flops'] / 1e9:.3g} GFLOP/s, "
                     f"{a['hbm_bandwidth_Bps'] / 1e9:.3g} GB/s")
    lines.append(f"  profile written: {s['profile']}")
    return "\n".join(lines)


KEPT = "; kept the base profile's value"
NOT_IDENTIFIABLE = " not identifiable: "


def merged_notes(notes: tuple[str, ...] | list[str]) -> list[str]:
    """The fit's notes on the figures it could not pin down (`FitReport.unidentified`), one
    line per reason rather than one per figure (a CPU host's calibration gave 14 lines, most
    with the same reason); a note of another shape stays as it is, after them."""
    by_reason: dict[str, list[str]] = {}
    other = []
    for note in notes:
        figure, found, rest = note.partition(NOT_IDENTIFIABLE)
        if not found or not rest.endswith(KEPT):
            other.append(note)
            continue
        by_reason.setdefault(rest[:-len(KEPT)], []).append(figure)
    lines = [f"{figures[0]}{NOT_IDENTIFIABLE}{reason}{KEPT}" if len(figures) == 1 else
             f"{len(figures)} figures not identifiable, each for the same reason: {reason}; "
             f"kept the base profile's values of {', '.join(figures)}"
             for reason, figures in by_reason.items()]
    return lines + other
