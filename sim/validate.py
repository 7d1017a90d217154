"""`parasim validate`: run a config for real, simulate the same plan, and say how far apart they
are — op by op, step by step, and in peak memory per rank.

    parasim validate sim/examples/gpt-tiny-localhost.toml --profile here.json --report v.html
    parasim validate my.toml --json          # no profile: the microbenchmarks run first

Without `--profile` the machine is calibrated first by the microbenchmarks alone
(`parasim calibrate --run` on the config: its cluster, world and dtype), so the prediction never
sees the run it is judged against. Then the plan is run (`executor.run`: `--warmup` steps
unrecorded, `--steps` recorded; the measured step is their median, the op-by-op comparison is
the last one's) and simulated unfolded, rank for rank, with the profile's links and roofs in
place. `traces.compare` lines the two traces up. `--json` prints `step_time_measured_s`,
`step_time_predicted_s`, `step_error` = (predicted - measured) / measured, `mape_by_op_class`,
`peak_memory_measured_bytes` and `peak_memory_predicted_bytes` (per rank), and the detail;
`--report` writes the plotly page (`sim.validate_report`). The executor loads only here.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.calibrate.command import (
    DEFAULT_PROBES,
    DEFAULT_SIZES,
    bench_spec,
    experiment_target,
    host_backend,
    parse_probes,
    run_microbenchmarks,
)
from sim.collective_table import parse_sizes
from sim.config import Experiment, example_path, load_experiment
from sim.profile import Profile
from sim.provenance import file_sha256, provenance
from sim.replay import StepTimes
from sim.simulate import predict
from traces.compare import Comparison, compare
from traces.errors import ConfigError, warn
from traces.files import Outputs, check_outputs
from traces.ops import Trace

MAX_STEPS = 100


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="TOML config (default: the shipped tiny GPT "
                        "on this machine, gpt-tiny-localhost.toml)")
    parser.add_argument("--profile", metavar="JSON", help="calibrated profile (default: run "
                        "the microbenchmarks first)")
    parser.add_argument("--report", metavar="HTML", help="write a plotly report")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--steps", type=int, default=3, help="recorded steps (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded steps (default 1)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds the run (and the microbenchmarks) may take (default 600)")
    parser.add_argument("--keep", metavar="DIR", help="keep the measured traces here")
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help=f"microbenchmark sizes without --profile (default {DEFAULT_SIZES})")
    parser.add_argument("--repeats", type=int, default=5, help="microbenchmark calls per size")
    parser.add_argument("--probes", default=DEFAULT_PROBES, metavar="HxSxB,...",
                        help="microbenchmark compute probes (see parasim calibrate)")


def run(args: argparse.Namespace, *, emit: Callable[[str], None]) -> int:
    config = Path(args.config) if args.config is not None else example_path(
        "gpt-tiny-localhost.toml")
    if importlib.util.find_spec("torch") is None:
        raise ConfigError("parasim validate runs the config for real and needs PyTorch: pip "
                          "install torch==2.13.0 (the CPU build) or pip install "
                          "'parasim[executor]'")
    if not 1 <= args.steps <= MAX_STEPS:
        raise ConfigError(f"--steps: {args.steps} must be from 1 to {MAX_STEPS}")
    if not 0 <= args.warmup <= MAX_STEPS:
        raise ConfigError(f"--warmup: {args.warmup} must be from 0 to {MAX_STEPS}")
    if not 1 <= args.timeout <= 24 * 3600:
        raise ConfigError(f"--timeout: {args.timeout:g} must be from 1 s to 24 h")
    overrides: dict[str, Any] = {}
    inputs = [config]
    if args.profile is not None:
        if not args.profile:
            raise ConfigError("--profile: an empty path names no file")
        inputs.append(Path(args.profile))
        overrides["profile"] = str(Path(args.profile).resolve())
    if args.keep is not None and (not args.keep or Path(args.keep).is_file()):
        raise ConfigError(f"--keep: {args.keep!r} must name a directory")
    exp = load_experiment(config, overrides)
    if exp.profile_path is not None:  # [sim] profile is an input too: never written over
        inputs.append(exp.profile_path)
    targets = check_outputs({"--report": args.report}, inputs=inputs)
    spec = None
    # Checked before anything runs: this host has the config's devices (a CPU run is no
    # measurement of an A100 cluster), and the microbenchmarks' flags.
    backend = host_backend(exp.cluster, exp.layout.world, str(config))
    if args.profile is None:
        target = experiment_target(exp)
        spec = bench_spec(target, parse_sizes(args.sizes), args.repeats,
                          parse_probes(args.probes, target))
    with Outputs() as outputs:
        result = validate(exp, steps=args.steps, warmup=args.warmup, timeout=args.timeout,
                          keep=args.keep, bench=spec, backend=backend)
        for note in result.calibration_notes:  # as `parasim calibrate` prints them
            warn(f"calibrate: {note}")
        if "--report" in targets:
            from sim.validate_report import render_validation  # plotly only when asked

            outputs.write(targets["--report"], render_validation(result))
        outputs.commit()
        emit(json.dumps(summary_json(result, config), allow_nan=False) if args.json
             else summary_text(result))
    return 0


def validate(exp: Experiment, *, steps: int = 3, warmup: int = 1, timeout: float = 600.0,
             keep: str | None = None, bench: Any = None, backend: str = "auto") -> Validation:
    """Calibrate (when `bench`, a `traces.bench.BenchSpec`, is given), run, simulate,
    compare."""
    calibrated_here = bench is not None
    notes: tuple[str, ...] = ()
    if bench is not None:
        from sim.calibrate.fit import fit_profile

        bench_dir = None if keep is None else str(Path(keep) / "bench")
        trace = run_microbenchmarks(bench, bench_dir, timeout, backend=backend)
        profile, report = fit_profile([trace], exp.cluster, base=exp.profile,
                                      name=f"{exp.name}-microbenchmarks")
        notes = report.unidentified
        exp = _with_profile(exp, profile)
    measured, step_times, peaks = _run(exp, steps, warmup, timeout, keep, backend)
    summary, times = predict(exp, fold=False)
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

def summary_json(v: Validation, config: Path) -> dict[str, Any]:
    c = v.comparison
    out: dict[str, Any] = {
        "experiment": v.exp.name,
        "cluster": v.exp.cluster.name,
        "world": v.exp.layout.world,
        "profile": {"name": v.exp.profile.name, "calibrated": v.exp.profile.calibrated,
                    "calibrated_here": v.calibrated_here},
        "step_time_measured_s": v.step_time_measured_s,
        "step_time_predicted_s": v.step_time_predicted_s,
        "step_error": v.step_error,
        "step_times_measured_s": v.step_times_measured_s,
        "mape_by_op_class": {k.op_class: k.mape for k in c.classes},
        "op_classes": [{"op_class": k.op_class, "count": k.count, "measured_s": k.measured_s,
                        "predicted_s": k.predicted_s, "mape": k.mape, "bias": k.bias}
                       for k in c.classes],
        "ops_compared": len(c.rows),
        "peak_memory_measured_bytes": {str(r): b for r, b in
                                       sorted(v.peak_memory_measured_bytes.items())},
        "peak_memory_predicted_bytes": {str(r): b for r, b in
                                        sorted(v.peak_memory_predicted_bytes.items())},
    }
    return {**out, **provenance(v.exp.profile, file_sha256(config))}


def summary_text(v: Validation) -> str:
    c = v.comparison
    source = "microbenchmarks run here" if v.calibrated_here else "given"
    lines = [
        f"parasim validate: {v.exp.name} on {v.exp.cluster.name} ({v.exp.layout.world} ranks), "
        f"profile {v.exp.profile.name} ({source})",
        f"  step time      measured {v.step_time_measured_s:.4g} s (median of "
        f"{len(v.step_times_measured_s)}), predicted {v.step_time_predicted_s:.4g} s: "
        f"{v.step_error:+.1%}",
        "  op class                      ops   measured s  predicted s    MAPE    bias",
    ]
    for k in sorted(c.classes, key=lambda k: -k.measured_s):
        lines.append(f"    {k.op_class:<26}{k.count:5d}  {k.measured_s:11.4g}  "
                     f"{k.predicted_s:11.4g}  {k.mape:6.1%}  {k.bias:+6.1%}")
    lines.append("  peak memory (MiB)   rank  measured  modelled")
    for r in sorted(v.peak_memory_measured_bytes):
        lines.append(f"    {'':16}{r:6d}  {v.peak_memory_measured_bytes[r] / 2**20:8.1f}  "
                     f"{v.peak_memory_predicted_bytes[r] / 2**20:8.1f}")
    return "\n".join(lines)
