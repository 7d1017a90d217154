"""Validation: run a config for real, simulate the same plan, compare — op by op, step by step
and in peak memory per rank (`parasim validate`, `sim.commands.validate`).

Without a profile the machine is first calibrated by the microbenchmarks alone, so the
prediction never sees the run it is judged against. The measured step is the median of the
recorded steps; the op-by-op comparison is the last one's (`traces.compare`). The executor
loads only when `validate` runs.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.calibrate.microbench import run_microbenchmarks
from sim.config import Experiment
from sim.engine.replay import StepTimes
from sim.profile import Profile
from sim.provenance import provenance
from sim.settings import Setting, config_sha256
from sim.simulate import predict
from traces.compare import Comparison, compare
from traces.errors import ConfigError
from traces.ops import Trace


@dataclass(frozen=True, kw_only=True)
class Validation:
    exp: Experiment
    """The experiment as simulated (the profile used in place)."""
    measured: Trace
    """The last recorded step, timed."""
    predicted: StepTimes
    comparison: Comparison
    step_times_measured_s: list[float]
    peak_memory_measured_bytes: dict[int, int]
    peak_memory_predicted_bytes: dict[int, float]
    calibrated_here: bool
    """The profile came from this run's microbenchmarks (no --profile)."""
    calibration_notes: tuple[str, ...] = ()
    """The figures those microbenchmarks did not pin down (`FitReport.unidentified`)."""

    @property
    def step_time_measured_s(self) -> float:
        return statistics.median(self.step_times_measured_s)

    @property
    def step_time_predicted_s(self) -> float:
        return self.predicted.step_time_s

    @property
    def step_error(self) -> float:
        return (self.step_time_predicted_s - self.step_time_measured_s) / \
            self.step_time_measured_s


def validate(exp: Experiment, *, steps: int = 3, warmup: int = 1, timeout: float = 600.0,
             keep: str | None = None, bench: Any = None, backend: str = "auto",
             phase: Callable[[str], None] = lambda name: None,
             job: Callable[[str, int], AbstractContextManager[object]] = lambda label, steps:
             nullcontext()) -> Validation:
    """Calibrate (when `bench`, a `traces.bench.BenchSpec`, is given), run, simulate,
    compare; `phase(name)` is told as each begins, and `job(label, steps)` is entered around
    each local job (the microbenchmarks, 1 step; the run) to count its ranks and ops (the
    command's progress, `sim.commands.common.job_progress`)."""
    calibrated_here = bench is not None
    notes: tuple[str, ...] = ()
    if bench is not None:
        phase("microbenchmarks")
        from sim.calibrate.fit import fit_profile

        bench_dir = None if keep is None else str(Path(keep) / "bench")
        with job("validate microbenchmarks", 1):
            trace = run_microbenchmarks(bench, bench_dir, timeout, backend=backend)
        profile, report = fit_profile([trace], exp.cluster, base=exp.profile,
                                      name=f"{exp.name}-microbenchmarks")
        notes = report.unidentified
        exp = _with_profile(exp, profile)
    phase(f"run ({warmup} + {steps} steps)")
    with job("validate run", steps):
        measured, step_times, peaks = _run(exp, steps, warmup, timeout, keep, backend)
    phase("simulate")
    summary, times = predict(exp, fold=False)
    phase("compare")
    comparison = compare(measured, times.timed_trace())
    stages = summary.memory_by_pp_rank
    predicted_peaks = {r: stages[exp.layout.coords(r).pp].total_bytes
                       for r in range(exp.layout.world)}
    return Validation(exp=exp, measured=measured, predicted=times, comparison=comparison,
                      step_times_measured_s=step_times, peak_memory_measured_bytes=peaks,
                      peak_memory_predicted_bytes=predicted_peaks,
                      calibrated_here=calibrated_here, calibration_notes=notes)


def _with_profile(exp: Experiment, profile: Profile) -> Experiment:
    return dataclasses.replace(exp, profile=profile, cluster=profile.applied_to(exp.cluster))


def _run(exp: Experiment, steps: int, warmup: int, timeout: float, keep: str | None,
         backend: str = "auto") -> tuple[Trace, list[float], dict[int, int]]:
    from executor.launch import JobFailed
    from executor.run import run as execute

    with tempfile.TemporaryDirectory(prefix="parasim-validate-") as tmp:
        out = Path(keep) / "run" if keep is not None else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        try:
            result = execute(exp, out, steps=steps, warmup=warmup, timeout=timeout,
                             backend=backend)
        except JobFailed as err:
            raise ConfigError(f"validate: the run failed: {err}") from None
    if result is None:  # a torchrun rank other than 0
        raise SystemExit(0)
    return result.trace, list(result.step_seconds), dict(result.peak_memory_bytes)


# --- output ---------------------------------------------------------------------------------

def ranks_note(profile: Profile, world: int) -> str | None:
    """What a calibrated profile's rank count says about a run of `world` ranks: the same
    count, another one (its figures were measured under another share of the host's cores
    and links), or not recorded; None for an uncalibrated profile (measured nowhere)."""
    if not profile.calibrated:
        return None
    if profile.measured_ranks is None:
        return (f"the profile {profile.name} does not record how many ranks it was measured "
                f"with (an older parasim wrote it); this run has {world}")
    if profile.measured_ranks == world:
        return f"the profile was measured with {world} ranks, as this run has"
    return (f"the profile was measured with {profile.measured_ranks} ranks, this run has "
            f"{world}: figures measured under another share of the host's cores and links "
            "may not carry over (calibrate with as many ranks as the run)")


def summary_json(v: Validation, config: Path, settings: tuple[Setting, ...] = ()
                 ) -> dict[str, Any]:
    c = v.comparison
    out: dict[str, Any] = {
        "experiment": v.exp.name,
        "cluster": v.exp.cluster.name,
        "world": v.exp.layout.world,
        "profile": {"name": v.exp.profile.name, "calibrated": v.exp.profile.calibrated,
                    "calibrated_here": v.calibrated_here},
        "profile_ranks": v.exp.profile.measured_ranks,
        "step_time_measured_s": v.step_time_measured_s,
        "step_time_predicted_s": v.step_time_predicted_s,
        "step_error": v.step_error,
        "step_times_measured_s": v.step_times_measured_s,
        "mape_by_op_class": {k.op_class: k.mape for k in c.classes},
        "op_classes": [{"op_class": k.op_class, "count": k.count, "measured_s": k.measured_s,
                        "predicted_s": k.predicted_s, "mape": k.mape, "bias": k.bias}
                       for k in c.classes],
        "ops_compared": len(c.rows),
        "step_time_measured_spread_s": spread(v.step_times_measured_s),
        "noise_floor": noise_floor(v.step_times_measured_s),
        "op_abs_error": op_abs_error(c),
        "peak_memory_measured_bytes": {str(r): b for r, b in
                                       sorted(v.peak_memory_measured_bytes.items())},
        "peak_memory_predicted_bytes": {str(r): b for r, b in
                                        sorted(v.peak_memory_predicted_bytes.items())},
    }
    return {**out, **provenance(v.exp.profile, config_sha256(config, settings))}


def summary_text(v: Validation) -> str:
    c = v.comparison
    source = "microbenchmarks run here" if v.calibrated_here else "given"
    lines = [
        f"parasim validate: {v.exp.name} on {v.exp.cluster.name} ({v.exp.layout.world} ranks), "
        f"profile {v.exp.profile.name} ({source})",
        f"  step time      measured {v.step_time_measured_s:.4g} s (median of "
        f"{len(v.step_times_measured_s)}), predicted {v.step_time_predicted_s:.4g} s: "
        f"{v.step_error:+.1%}",
        f"  {'noise floor':<15}{noise_text(v)}",
    ]
    if (note := ranks_note(v.exp.profile, v.exp.layout.world)) is not None:
        lines.append(f"  {'profile ranks':<15}{note}")
    low, high = min(v.step_times_measured_s), max(v.step_times_measured_s)
    lines.append(f"  {'measured steps':<15}min {low:.4g} s, median "
                 f"{v.step_time_measured_s:.4g} s, max {high:.4g} s (spread "
                 f"{(high - low) / v.step_time_measured_s:.1%} of the median)")
    errors = op_abs_error(c)
    if errors:
        lines.append(f"  {'op errors':<15}|predicted - measured| / measured over "
                     f"{len(c.rows):,} ops: median {errors['median']:.1%}, 90th percentile "
                     f"{errors['p90']:.1%} (the step's error sums them: over- and "
                     "under-predictions cancel there)")
    lines.append("  op class                      ops   measured s  predicted s    MAPE    bias")
    for k in sorted(c.classes, key=lambda k: -k.measured_s):
        lines.append(f"    {k.op_class:<26}{k.count:5d}  {k.measured_s:11.4g}  "
                     f"{k.predicted_s:11.4g}  {k.mape:6.1%}  {k.bias:+6.1%}")
    lines.append("  peak memory (MiB)   rank  measured  modelled")
    for r in sorted(v.peak_memory_measured_bytes):
        lines.append(f"    {'':16}{r:6d}  {v.peak_memory_measured_bytes[r] / 2**20:8.1f}  "
                     f"{v.peak_memory_predicted_bytes[r] / 2**20:8.1f}")
    return "\n".join(lines)


def noise_floor(times: list[float]) -> float | None:
    """This host's step-to-step noise: half the measured steps' spread over their median (an
    error within it cannot be told from none); None from one step."""
    if len(times) < 2:
        return None
    return (max(times) - min(times)) / 2 / statistics.median(times)


def noise_text(v: Validation) -> str:
    """The noise floor beside the step error, and the error against each measured step."""
    floor = noise_floor(v.step_times_measured_s)
    if floor is None:
        return "unknown from 1 measured step (--steps 3 or more measures it)"
    errors = [v.step_time_predicted_s / t - 1 for t in v.step_times_measured_s]
    where = "within it" if abs(v.step_error) <= floor else "beyond it"
    return (f"±{floor:.1%} (half the measured steps' spread): the step error is {where}; "
            f"against each measured step it runs from {min(errors):+.1%} to "
            f"{max(errors):+.1%}")


def spread(times: list[float]) -> dict[str, float]:
    """The measured steps' min, median and max: how far one step can be from another."""
    return {"min": min(times), "median": statistics.median(times), "max": max(times)}


def op_abs_error(c: Comparison) -> dict[str, float]:
    """The median and 90th percentile of the ops' |error|, which no sum can cancel ({} when no
    op was compared)."""
    errors = sorted(abs(r.error) for r in c.rows if r.measured_s > 0)
    if not errors:
        return {}
    return {"median": statistics.median(errors),
            "p90": errors[min(len(errors) - 1, int(0.9 * len(errors)))]}
