"""Benchmark: calibrate this machine from microbenchmarks only, then predict held-out steps.

    python tests/bench/bench_calibration.py [--runs 5] [--sizes 4K:256M] [--profile P.json]
    python tests/bench/bench_calibration.py --fit-time [--repeat 5]

On the host's CPU with gloo (2 ranks): `parasim calibrate --run localhost` (collective sweeps,
send/recv, compute probes over a grid of shapes; never a step of the cases below), then each
held-out full step is run for real (`executor.run`, 2 warm-up steps, `--runs` recorded) and
predicted by `sim.simulate.predict` with the fitted profile:

    DP 2 · TP 2 · PP 2 1F1B m=4 · PP 2 1F1B m=8 · ZeRO-3 on 2 ranks

all on the tiny GPT of sim/examples/gpt-tiny-localhost.toml (4 layers, hidden 128, fp32, flash
attention, micro-batch 2). Prints each case's measured step (median of the runs), predicted
step and error, and the MAPE over the cases; with `--calibrations K` the calibration is
repeated K times and the medians of the errors are reported too. The load average is printed
before and after (the machine is shared: quote figures from quiet runs). Target: MAPE <= 15%.

Measured on the 2-vCPU CI box (Intel Xeon, KVM; 1-minute load 0.9-1.0 before each case), 20
steps per case, `--calibrations 5`: per calibration MAPE 10.9%, 8.3%, 22.1%, 11.4%, 12.8%;
medians DP 2 -5.8%, TP 2 -7.5%, PP m=4 +2.9%, PP m=8 +5.2%, ZeRO-3 -28.0%: MAPE of the medians
9.9%. Most of the spread between calibrations is the machine: the same case measured minutes
apart varies by 10-25% (DP 2: 54-81 ms over one hour), and a calibration that ran fast reads
every case slow. ZeRO-3 is what the model still leaves out: its gathers run 3-4x slower beside
the kernels than alone, with a heavy tail (0.9-13.5 ms for one 790 KB gather), and the real run
waits 40-47 ms a step for them where the simulator, with mean times, exposes a few ms. The
interference section fits communication beside kernels as a wait plus a slowdown
(`compute_interference_delay_s`, `compute_interference`): here 0-1 ms and 0.5-0.8. Tried and
left out: one overhead per op instead of per launch (a backward's two GEMMs): the probes fit
better (compute rms 22-24% against 27-30%) but the held-out steps read 16.4% (DP -15%, TP -17%,
ZeRO-3 -37%).

`--fit-time` times the fit alone (`fit_profile`, the median process time of `--repeat` fits;
the machine is shared) on fixed inputs, and runs nothing: two simulated H100 TP 2 steps (micro
batch 1 and 2, as whatif's tests capture them: kernels of one shape each held at the base's
figures, the rest fitted again), the same at micro batch 1 alone, and the two shipped
profiler traces of tests/data/kineto (links only). On the 2-vCPU box (load 5.7), A/B twice
back to back, `--repeat 5`: the two steps took 1.58 and 1.66 s while held figures were pinned
by bounds (the second solve ran to its 2000-step cap), 0.047 and 0.050 s since they left the
solve (33x); the others 0.016-0.043 s either way.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sim.calibrate.fit import fit_profile
from sim.calibrate.interference import InterferenceFit
from sim.calibrate.microbench import (
    DEFAULT_PROBES,
    bench_spec,
    fit_target,
    parse_probes,
    read_traces,
    resolve_target,
)
from sim.commands.common import parse_sizes
from sim.config import experiment_from_dict
from sim.profile import Profile, default_profile, load_profile
from sim.simulate import predict
from topology.cluster import Cluster
from traces.ops import Trace

MODEL = {"layers": 4, "hidden": 128, "heads": 4, "seq_len": 64, "vocab": 512, "dtype": "fp32",
         "attention": "flash"}
CASES = {
    "DP 2": {"dp": 2, "micro_batch": 2, "global_batch": 8},
    "TP 2": {"tp": 2, "micro_batch": 2, "global_batch": 8},
    "PP 2 1F1B m=4": {"pp": 2, "micro_batch": 2, "global_batch": 8, "schedule": "1f1b"},
    "PP 2 1F1B m=8": {"pp": 2, "micro_batch": 2, "global_batch": 16, "schedule": "1f1b"},
    "ZeRO-3 DP 2": {"dp": 2, "zero": 3, "micro_batch": 2, "global_batch": 8},
}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min) {five:.2f} (5 min)"


def wait_for_quiet(max_load: float, patience_s: float) -> None:
    """Wait (up to `patience_s`) until the 1-minute load average is under `max_load`: the
    machine is shared, and another job's processes on our 2 cores are noise, not model."""
    end = time.monotonic() + patience_s
    while os.getloadavg()[0] >= max_load and time.monotonic() < end:
        time.sleep(5)


def calibrate(sizes: str, probes: str, repeats: int, keep: str | None) -> Profile:
    from sim.calibrate.microbench import host_backend, run_microbenchmarks

    target = resolve_target("localhost", 2)
    spec = bench_spec(target, parse_sizes(sizes), repeats, parse_probes(probes, target))
    start = time.perf_counter()
    backend = host_backend(target.cluster, target.world, "--run localhost")  # gloo, CPU
    trace = run_microbenchmarks(spec, keep, timeout=1800, backend=backend)
    profile, report = fit_profile([trace], target.cluster, base=target.profile,
                                  name="bench-calibration")
    link = profile.links["loopback"]
    assert report.links is not None and report.compute is not None, "the sweep and probes ran"
    print(f"calibrated in {time.perf_counter() - start:.0f} s: loopback "
          f"{link.latency_s * 1e6:.1f} us, {link.bandwidth_Bps / 1e9:.2f} GB/s (links rms "
          f"{report.links.rms_error:.1%}, compute rms {report.compute.rms_error:.1%}), "
          f"comm interference {profile.compute.comm_interference:.3g}"
          + _kept(report.interference)
          + f", compute interference {profile.compute.compute_interference:.3g}"
          + _kept(report.compute_interference)
          + f" after {profile.compute.compute_interference_delay_s * 1e3:.2f} ms"
          + _kept(report.compute_interference_delay), flush=True)
    for note in report.unidentified:
        print(f"  not identified: {note}", flush=True)
    return profile


def _kept(fit: InterferenceFit | None) -> str:
    """What follows an interference figure the data did not pin down."""
    return "" if fit is None or fit.unidentified is None else " (not identified: the default's)"


def measure(name: str, runs: int, profile: Profile) -> tuple[float, float]:
    from executor.run import run

    config = {"model": MODEL, "parallel": CASES[name],
              "cluster": {"preset": "localhost", "gpus_per_node": 2}}
    exp = experiment_from_dict(config, name=name)
    exp = type(exp)(name=exp.name, model=exp.model, layout=exp.layout,
                    cluster=profile.applied_to(exp.cluster), profile=profile)
    with tempfile.TemporaryDirectory() as out:
        result = run(exp, out, steps=runs, warmup=2, timeout=600)
    assert result is not None
    measured = statistics.median(result.step_seconds)
    predicted = predict(exp, fold=False)[0].step_time_s
    return measured, predicted


STEP = {"model": {"layers": 2, "hidden": 256, "heads": 8, "seq_len": 128, "vocab": 1024},
        "cluster": {"preset": "dgx-h100", "gpus_per_node": 2}}
KINETO = Path(__file__).parents[1] / "data" / "kineto"


def fit_inputs() -> Iterator[tuple[str, Cluster, list[Trace], Profile]]:
    """The fixed inputs `--fit-time` fits: name, cluster, traces, base profile."""
    steps = []
    for mb in (1, 2):
        exp = experiment_from_dict({**STEP, "parallel": {"tp": 2, "micro_batch": mb,
                                                         "global_batch": 4}})
        steps.append(predict(exp, fold=False)[1].timed_trace())
    base = default_profile(exp.cluster.accelerator)
    yield "H100 TP 2 steps, micro batch 1 and 2 (simulated)", exp.cluster, steps, base
    yield "H100 TP 2 step, micro batch 1 (simulated)", exp.cluster, steps[:1], base
    for path in sorted(KINETO.glob("*.json.gz")):
        traces = [read_traces(path)]
        target = fit_target("dgx-a100", traces)
        yield f"{path.name} on dgx-a100 (links)", target.cluster, traces, target.profile


def time_fits(repeat: int) -> None:
    """Print each fixed input's median process time of `fit_profile` over `repeat` fits."""
    print(f"fit time, median of {repeat} (process time; {load()})")
    for name, cluster, traces, base in fit_inputs():
        seconds = []
        for _ in range(repeat):
            start = time.process_time()
            fit_profile(traces, cluster, base=base, name="bench-fit")
            seconds.append(time.process_time() - start)
        print(f"  {name:<52}{statistics.median(seconds):8.3f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20,
                        help="recorded steps per case (default 20: a 5-step median of PP 2 "
                        "read 10%% slower than a 60-step one, for 1 step in 20 taking 2x)")
    parser.add_argument("--calibrations", type=int, default=1)
    parser.add_argument("--sizes", default="4K:256M")
    parser.add_argument("--probes", default=DEFAULT_PROBES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", help="use this profile instead of calibrating")
    parser.add_argument("--keep", help="keep the microbenchmark traces here")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--max-load", type=float, default=1.0,
                        help="wait for the 1-minute load average to fall under this before "
                        "each measurement (default 1.0)")
    parser.add_argument("--patience", type=float, default=900.0,
                        help="longest wait for a quiet machine, in seconds (default 900)")
    parser.add_argument("--fit-time", action="store_true",
                        help="only time the fit on fixed inputs (nothing is run)")
    parser.add_argument("--repeat", type=int, default=5, help="fits per input (--fit-time)")
    args = parser.parse_args()
    if args.fit_time:
        time_fits(args.repeat)
        return
    print(f"parasim calibration benchmark, {os.cpu_count()} CPUs, {load()}", flush=True)
    names = [c for c in args.cases.split(",") if c]
    errors: dict[str, list[float]] = {n: [] for n in names}
    for k in range(args.calibrations):
        wait_for_quiet(args.max_load, args.patience)
        profile = load_profile(args.profile) if args.profile else \
            calibrate(args.sizes, args.probes, args.repeats, args.keep)
        print(f"{'case':<16}{'measured s':>12}{'predicted s':>13}{'error':>9}   ({load()})")
        for name in names:
            wait_for_quiet(args.max_load, args.patience)
            before = load()
            measured, predicted = measure(name, args.runs, profile)
            error = (predicted - measured) / measured
            errors[name].append(error)
            print(f"{name:<16}{measured:12.4f}{predicted:13.4f}{error:+9.1%}   (before: "
                  f"{before})", flush=True)
        mape = statistics.fmean(abs(errors[n][-1]) for n in names)
        print(f"MAPE {mape:.1%} (calibration {k + 1} of {args.calibrations}; {load()})\n",
              flush=True)
    if args.calibrations > 1:
        print("medians over the calibrations:")
        for name in names:
            print(f"  {name:<16}{statistics.median(errors[name]):+8.1%}")
        mape = statistics.fmean(abs(statistics.median(errors[n])) for n in names)
        print(f"  MAPE of the medians {mape:.1%}")


if __name__ == "__main__":
    main()
