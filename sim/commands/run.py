"""`parasim run`: execute a config's plan for real with the executor, and summarise the run.

    parasim run sim/examples/gpt-tiny-localhost.toml --out runs/tiny [--steps 2] [--json]
    parasim run my.toml --out runs/k --kernels     # + kernels-rank<r>.json (torch.profiler)
    parasim run my.toml --out runs/few --trace-ranks 0,8-15   # every rank runs; 9 are written
    torchrun --nproc-per-node 8 -m sim run my.toml --out runs/x      # joins torchrun's world

The executor (and torch) load only here and only when asked for: the simulator installs and
runs without them. Writes DIR/rank<r>.json (measured traces, parasim's format) and
DIR/chrome.json (Perfetto), and with --kernels each rank's profiler trace of the recorded
steps, DIR/kernels-rank<r>.json (`traces.kineto`). A plan the executor refuses is one line
(exit 2) before anything is written. A failed rank is one line naming the rank and the op;
the traces recorded up to then are written, marked incomplete (`meta.complete = false`).
A run's files are one set (`traces.outdir`): written to a hidden folder beside DIR and moved in
whole, so a failed write or a killed run leaves nothing; DIR must be new or empty, or hold an
older run (`--force` replaces it), and may not hold the run's own inputs. Under torchrun the
ranks write DIR itself (they have no one folder to agree on), after the same checks.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

from sim.commands.common import config_path, emit, error, job_progress
from sim.commands.trace_ranks import parse_ranks
from sim.config import Experiment, example_path
from sim.provenance import provenance
from sim.settings import add_set_flag, config_sha256, load_set_experiment, parse_settings
from traces.errors import ConfigError
from traces.outdir import StagedDir

HELP = "execute a config's plan for real (needs torch)"

MAX_STEPS = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="TOML config (default: the shipped tiny GPT "
                        "on this machine, gpt-tiny-localhost.toml)")
    parser.add_argument("--out", required=True, metavar="DIR", help="where the traces go")
    parser.add_argument("--steps", type=int, default=1, help="recorded steps (default 1)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded steps first (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds any collective, and the whole job, may take (default 60)")
    parser.add_argument("--kernels", action="store_true", help="also write each rank's "
                        "torch.profiler trace of the recorded steps (kernels-rank<r>.json)")
    parser.add_argument("--force", action="store_true", help="replace an older run in DIR")
    parser.add_argument("--trace-ranks", metavar="R,A-B", help="write only these ranks' traces "
                        "(rank<r>.json, chrome.json, kernels): every rank still runs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_set_flag(parser)


def run(args: argparse.Namespace) -> int:
    config = config_path(args.config, example_path("gpt-tiny-localhost.toml"))
    check_run_args(args.out, args.steps, args.warmup, args.timeout)
    settings = parse_settings(args.settings)
    exp = load_set_experiment(config, settings)
    trace_ranks = None if args.trace_ranks is None else parse_ranks(args.trace_ranks,
                                                                      exp.layout.world)
    check_torchrun(exp.layout.world)
    inputs = [config, *([exp.profile_path] if exp.profile_path else [])]
    staged = StagedDir.check("--out", args.out, inputs=inputs, force=args.force)
    try:
        summary = execute(exp, staged, args.steps, args.warmup, args.timeout, args.kernels,
                          trace_ranks)
    except RunFailed as err:
        error(str(err))
        return 1
    if summary is not None:  # rank 0 (or the local launcher) reports
        emit(json.dumps({**summary, **provenance(exp.profile, config_sha256(config, settings))},
                        allow_nan=False) if args.json else summary_text(summary))
    return 0


class RunFailed(Exception):
    """The job started but a rank failed: one line, and the partial traces it left."""


def check_run_args(out: str, steps: int, warmup: int, timeout: float) -> None:
    """Everything about the flags that can be refused before starting processes."""
    if importlib.util.find_spec("torch") is None:
        raise ConfigError("parasim run needs PyTorch: pip install torch==2.13.0 (the CPU "
                          "build) or pip install 'parasim[executor]'")
    if not 1 <= steps <= MAX_STEPS:
        raise ConfigError(f"--steps: {steps} must be from 1 to {MAX_STEPS}")
    if not 0 <= warmup <= MAX_STEPS:
        raise ConfigError(f"--warmup: {warmup} must be from 0 to {MAX_STEPS}")
    if not 1 <= timeout <= 24 * 3600:
        raise ConfigError(f"--timeout: {timeout:g} must be from 1 s to 24 h")
    if not out:
        raise ConfigError("--out: an empty path names no directory")


def check_torchrun(world: int) -> None:
    """Under torchrun: its environment and world, before anything starts
    (`executor.torchrun.check_env`)."""
    from executor.launch import in_torchrun

    if in_torchrun():
        from executor.torchrun import check_env

        check_env(world)


def execute(exp: Experiment, staged: StagedDir, steps: int, warmup: int, timeout: float,
            kernels: bool = False, trace_ranks: tuple[int, ...] | None = None
            ) -> dict[str, Any] | None:
    """Run for real into `staged`, then move it in whole; the summary as a JSON-able dict
    (None on torchrun ranks other than 0). `trace_ranks`: the ranks whose traces are written."""
    from executor.launch import JobFailed, in_torchrun
    from executor.run import run

    torchrun = in_torchrun()
    if torchrun:  # every rank writes: the target itself, made now
        staged.discard()
        staged.target.mkdir(parents=True, exist_ok=True)
    out = staged.target if torchrun else staged.path
    try:
        with job_progress("run", steps):
            result = run(exp, out, steps=steps, warmup=warmup, timeout=timeout,
                         kernels=kernels, trace_ranks=trace_ranks)
    except JobFailed as err:
        written = ", ".join(str(_moved(f, staged, torchrun)) for f in err.files) or "none"
        _commit(staged, torchrun, bool(err.files))
        raise RunFailed(f"{err} (partial traces, marked incomplete: {written})") from None
    except OSError as err:  # the disk filled, a file could not be written: keep nothing
        staged.discard()
        raise RunFailed(f"--out: cannot write the run's traces to {staged.target}: "
                        f"{err.strerror or err}; nothing was kept") from None
    except BaseException:  # refused, interrupted, terminated: leave nothing behind
        staged.discard()
        raise
    if result is None:
        return None
    _commit(staged, torchrun, True)
    return {
        "experiment": exp.name,
        "world": exp.layout.world,
        "backend": result.trace.meta.backend,
        "steps": steps,
        "step_times_s": result.step_seconds,
        "step_time_s": result.step_seconds[-1],
        "losses": result.losses,
        "peak_memory_bytes": {str(r): b for r, b in sorted(result.peak_memory_bytes.items())},
        "files": [str(_moved(f, staged, torchrun)) for f in result.files],
        **ran_kernels(exp),
    }


def ran_kernels(exp: Experiment) -> dict[str, str]:
    """The software stack the executor ran: always eager PyTorch (`traces.stack`), said where
    the config states a stack ([model] kernels), so a default run's summary is as it was."""
    return {} if exp.model.kernels == "fused" else {"kernels": "eager",
                                                    "plan_kernels": exp.model.kernels}


def _commit(staged: StagedDir, torchrun: bool, wrote: bool) -> None:
    if torchrun:
        return
    if wrote:
        staged.commit()
    else:
        staged.discard()


def _moved(path: Path, staged: StagedDir, torchrun: bool) -> Path:
    """Where a file written to the hidden folder lies once moved in."""
    return path if torchrun else staged.target / Path(path).relative_to(staged.path)


def summary_text(summary: dict[str, Any]) -> str:
    peak = max(summary["peak_memory_bytes"].values(), default=0)
    lines = [
        f"parasim run: {summary['experiment']}, {summary['world']} ranks "
        f"({summary['backend']}), {summary['steps']} recorded step(s)",
        f"  step time           {summary['step_time_s']:.4g} s (measured)",
        "  loss                " + ", ".join(f"{x:.6g}" for x in summary["losses"]),
        f"  peak memory         {peak / 2**20:.1f} MiB on the fullest rank",
        "  traces              " + ", ".join(summary["files"]),
    ]
    if "kernels" in summary:
        lines.append(f"  kernels             {summary['kernels']} PyTorch (the plan's: "
                     f"{summary['plan_kernels']})")
    return "\n".join(lines)
