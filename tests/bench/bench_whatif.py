"""Benchmark: `parasim whatif` from one real gloo capture against the target run for real.

    python tests/bench/bench_whatif.py [--repeats 3] [--steps 3]

For each (captured layout -> target layout) pair of the tiny GPT on this host's CPU ranks
(gloo), `--repeats` times: record the captured job (`parasim run`, one step), predict the
target with `parasim whatif` (and with `--statistic mean`), and run the target right after
(`--steps` recorded steps, their median). A shared host's load moves every time by up to 4x
within minutes, so each prediction is compared with the run next to it in time; the pair's
error is the median over the repeats. Beside it: `parasim simulate` of the target with the
default profile (the uncalibrated prediction), the noise floor (the median relative
deviation of the target's repeated runs from their median), the range whatif gives, and the
time whatif takes.
Target (issue 34): median error <= 10%, better than simulate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOB = """
[model]
layers = 4
hidden = 128
heads = 4
seq_len = {seq}
vocab = 512
dtype = "fp32"
attention = "flash"

[parallel]
tp = {tp}
pp = {pp}
dp = {dp}
micro_batch = 2
global_batch = 8

[cluster]
preset = "localhost"
gpus_per_node = {world}
"""
BASE = {"seq": 64, "tp": 1, "pp": 1, "dp": 2}
PAIRS = [  # (name, captured, target); the first is the control: whatif of the job itself is
    # its replay, so its error is the floor the communication model and the host set
    ("DP2 -> DP2 (replay)", BASE, BASE),
    ("DP2 -> PP2", BASE, {**BASE, "dp": 1, "pp": 2}),
    ("DP2 -> TP2", BASE, {**BASE, "dp": 1, "tp": 2}),
    ("TP2 -> DP2", {**BASE, "dp": 1, "tp": 2}, BASE),
    ("DP2 -> DP4 (2 -> 4 ranks)", BASE, {**BASE, "dp": 4}),
    ("DP2 -> DP2 seq 128", BASE, {**BASE, "seq": 128}),
    ("PP2 -> DP2", {**BASE, "dp": 1, "pp": 2}, BASE),
]


def _toml(folder: Path, job: dict[str, int]) -> Path:
    world = job["tp"] * job["pp"] * job["dp"]
    name = "-".join(f"{k}{v}" for k, v in job.items())
    path = folder / f"{name}.toml"
    path.write_text(JOB.format(world=world, **job))
    return path


def _parasim(*argv: object) -> dict:
    proc = subprocess.run([sys.executable, "-m", "sim", *map(str, argv), "--json"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"parasim {' '.join(map(str, argv))}: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def _settings(job: dict[str, int]) -> list[str]:
    world = job["tp"] * job["pp"] * job["dp"]
    out = [f"parallel.{k}={job[k]}" for k in ("tp", "pp", "dp")]
    out += [f"model.seq_len={job['seq']}", f"cluster.gpus_per_node={world}"]
    return [w for s in out for w in ("--set", s)]


def _measured(folder: Path, config: Path, steps: int) -> tuple[float, float]:
    """The median and the fastest recorded step of a run of `config`."""
    run = _parasim("run", config, "--out", folder / config.stem, "--steps", steps, "--force")
    return statistics.median(run["step_times_s"]), min(run["step_times_s"])


def _pair(folder: Path, captured: dict[str, int], target: dict[str, int], repeats: int,
          steps: int) -> tuple:
    """(measured, whatif, its range, simulate, noise, whatif's seconds, error, fastest step,
    whatif --statistic mean, its error), medians over the repeats; each repeat a fresh
    capture, its prediction and the target's run."""
    source, config = _toml(folder, captured), _toml(folder, target)
    real, predicted, ranges, seconds, errors, fastest = [], [], [], [], [], []
    means: list[float] = []
    mean_errors: list[float] = []
    for _ in range(repeats):
        capture = folder / f"capture-{source.stem}"
        _parasim("run", source, "--out", capture, "--steps", 1, "--force")
        began = time.perf_counter()
        what = _parasim("whatif", capture, *_settings(target))
        seconds.append(time.perf_counter() - began)
        predicted.append(what["step_time_predicted_s"])
        means.append(_parasim("whatif", capture, *_settings(target), "--statistic",
                              "mean")["step_time_predicted_s"])
        ranges.append(what["step_time_range_s"])
        mid, best = _measured(folder, config, steps)
        real.append(mid)
        fastest.append(best)
        errors.append((predicted[-1] - real[-1]) / real[-1])
        mean_errors.append((means[-1] - real[-1]) / real[-1])
    plain = _parasim("simulate", config)["step_time_s"]
    mid = statistics.median(real)
    noise = statistics.median(abs(r - mid) / mid for r in real)
    i = errors.index(statistics.median_low(errors))
    return (mid, predicted[i], ranges[i], plain, noise, statistics.median(seconds),
            statistics.median(errors), min(fastest), statistics.median(means),
            statistics.median(mean_errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, captured, target in PAIRS:
            rows.append((name, *_pair(Path(tmp), captured, target, args.repeats, args.steps)))
            _print_row(rows[-1])
    errors = [abs(r[7]) for r in rows[1:]]
    mean_errors = [abs(r[10]) for r in rows[1:]]
    plain_errors = [abs(r[4] - r[1]) / r[1] for r in rows[1:]]
    print(f"median error over the {len(errors)} pairs: whatif "
          f"{100 * statistics.median(errors):.1f}% (--statistic mean "
          f"{100 * statistics.median(mean_errors):.1f}%), simulate "
          f"{100 * statistics.median(plain_errors):.1f}%, noise floor "
          f"{100 * statistics.median(r[5] for r in rows):.1f}%; the control's error "
          f"{100 * rows[0][7]:+.1f}%")


def _print_row(row: tuple) -> None:
    name, real, predicted, (low, high), plain, noise, seconds, error, best, mean, merr = row
    print(f"{name:<28} measured {real * 1e3:7.1f} ms (noise ±{100 * noise:4.1f}%, fastest "
          f"step {best * 1e3:.1f} ms)  whatif "
          f"{predicted * 1e3:7.1f} ms [{low * 1e3:.1f}, {high * 1e3:.1f}] "
          f"({100 * error:+.0f}% vs its run, {seconds:.2f} s)  simulate "
          f"{plain * 1e3:7.1f} ms ({100 * (plain - real) / real:+.0f}%)  whatif --statistic "
          f"mean {mean * 1e3:7.1f} ms ({100 * merr:+.0f}%)", flush=True)


if __name__ == "__main__":
    main()
