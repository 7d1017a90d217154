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
`--report` writes the plotly page (`sim.report.validation`). The executor loads only here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from typing import Any

from sim.calibrate.microbench import (
    DEFAULT_PROBES,
    DEFAULT_SIZES,
    bench_spec,
    experiment_target,
    host_backend,
    parse_probes,
)
from sim.calibrate.summary import merged_notes
from sim.commands.common import (
    Phases,
    config_path,
    emit,
    error,
    job_progress,
    parse_sizes,
    profile_flag,
)
from sim.config import example_path
from sim.settings import add_set_flag, load_set_experiment, parse_settings
from sim.validation import ranks_note, summary_json, summary_text, validate
from traces.errors import ConfigError, warn
from traces.files import Outputs, check_outputs
from traces.outdir import StagedDir, kept

HELP = "run a config for real, simulate it, compare op by op, step and memory"
MAX_STEPS = 100


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
    parser.add_argument("--max-error", type=float, metavar="FRACTION",
                        help="exit 1 when |step error| exceeds this (0.25: 25%%), for CI")
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help=f"microbenchmark sizes without --profile (default {DEFAULT_SIZES})")
    parser.add_argument("--repeats", type=int, default=5, help="microbenchmark calls per size")
    parser.add_argument("--probes", default=DEFAULT_PROBES, metavar="HxSxB,...",
                        help="microbenchmark compute probes (see parasim calibrate)")
    add_set_flag(parser)


def run(args: argparse.Namespace) -> int:
    config = config_path(args.config, example_path("gpt-tiny-localhost.toml"))
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
    if args.max_error is not None and not 0 < args.max_error <= 10:
        raise ConfigError(f"--max-error: {args.max_error:g} must be a fraction above 0 and at "
                          "most 10 (0.25 is 25%)")
    overrides: dict[str, Any] = {}
    inputs = [config]
    if (profile := profile_flag(args.profile, inputs)) is not None:
        overrides["profile"] = profile
    settings = parse_settings(args.settings)
    exp = load_set_experiment(config, settings, overrides)
    if exp.profile_path is not None:  # [sim] profile is an input too: never written over
        inputs.append(exp.profile_path)
    targets = check_outputs({"--report": args.report}, inputs=inputs)
    spec = None
    # Checked before anything runs: this host has the config's devices (a CPU run is no
    # measurement of an A100 cluster), and the microbenchmarks' flags.
    backend = host_backend(exp.cluster, exp.layout.world, str(config))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if backend == "gloo" and cores and exp.layout.world > cores:
        warn(f"validate: the run's {exp.layout.world} ranks share this host's {cores} cores: "
             "each waits for a core, so its measured steps swing and the error with them "
             "(a config of at most as many ranks as cores measures well)")
    note = ranks_note(exp.profile, exp.layout.world)
    if note is not None and exp.profile.measured_ranks not in (None, exp.layout.world):
        warn(f"validate: {note}")  # before the run: the user may stop and calibrate again
    if args.profile is None:
        target = experiment_target(exp)
        spec = bench_spec(target, parse_sizes(args.sizes), args.repeats,
                          parse_probes(args.probes, target))
    keep = (None if args.keep is None
            else StagedDir.check("--keep", args.keep, inputs=inputs, force_flag=""))
    with Outputs(targets.values()) as outputs, kept(keep) as keep_dir:
        with Phases("validate", 3 + (spec is not None)) as phase:
            result = validate(exp, steps=args.steps, warmup=args.warmup, timeout=args.timeout,
                              keep=keep_dir, bench=spec, backend=backend, phase=phase,
                              job=job_progress)
        for note in merged_notes(result.calibration_notes):  # as `parasim calibrate` does
            warn(f"calibrate: {note}")
        if "--report" in targets:
            from sim.report.validation import render_validation  # plotly only when asked

            outputs.write(targets["--report"], render_validation(result))
        outputs.commit()
        emit(json.dumps(summary_json(result, config, settings), allow_nan=False) if args.json
             else summary_text(result))
    if args.max_error is not None and abs(result.step_error) > args.max_error:
        error(f"validate: step error {result.step_error:+.1%} is beyond --max-error "
              f"{args.max_error:.1%}")
        return 1
    return 0


