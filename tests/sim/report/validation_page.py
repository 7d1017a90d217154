"""A validate page without a run (no torch): the shipped 2-rank example simulated, and the
same step, each op 1.25x slower, standing for what was measured."""

from __future__ import annotations

import dataclasses

from sim.config import example_path, load_experiment
from sim.report.validation import render_validation
from sim.simulate import predict
from sim.validation import Validation
from traces.compare import compare
from traces.ops import Trace

STRETCH = 1.25


def stretched(trace: Trace) -> Trace:
    """Every op's start and end times STRETCH: the same order, a slower step."""
    ops = {rank: [dataclasses.replace(op, start=op.start * STRETCH, end=op.end * STRETCH)
                  for op in ops] for rank, ops in trace.ops.items()}
    return dataclasses.replace(trace, ops=ops)


def simulated_validation_page() -> str:
    return render_validation(simulated_validation())


def simulated_validation(steps: tuple[float, ...] = (STRETCH,) * 3) -> Validation:
    """The validation of that stand-in, its measured steps `steps` x the predicted step."""
    exp = load_experiment(example_path("gpt-tiny-2rank-localhost.toml"))
    summary, times = predict(exp, fold=False)
    measured = stretched(times.timed_trace())
    peaks = {r: int(summary.peak_memory_bytes) for r in range(exp.layout.world)}
    return Validation(exp=exp, measured=measured, predicted=times,
                      comparison=compare(measured, times.timed_trace()),
                      step_times_measured_s=[times.step_time_s * k for k in steps],
                      peak_memory_measured_bytes=peaks,
                      peak_memory_predicted_bytes={r: float(b) for r, b in peaks.items()},
                      calibrated_here=False)
