"""Benchmark: `parasim whatif` from one real gloo capture against the target run for real.

    python tests/bench/bench_whatif.py [--repeats 3] [--steps 3] [--baseline DIR] [--only TEXT]

For each (captured layout -> target layout) pair of the tiny GPT on this host's CPU ranks
(gloo), `--repeats` times: record the captured job (`parasim run`, one step), predict the
target with `parasim whatif` (each `--statistic`, and the default with `--stragglers off`;
with `--baseline DIR`, also that checkout's whatif, e.g. an older commit's), and run the
target right after
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
import os
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


def _parasim(*argv: object, root: Path = ROOT) -> dict:
    proc = subprocess.run([sys.executable, "-m", "sim", *map(str, argv), "--json"],
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, check=False)
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


STATISTICS = ("load", "mean", "median", "share")
"""whatif's --statistic values, each predicted from the same capture (the first: the default)."""
OFF = "stragglers off"
"""The default statistic with `--stragglers off`: the prediction before the straggler model."""


def _pair(folder: Path, captured: dict[str, int], target: dict[str, int], repeats: int,
          steps: int, baseline: Path | None) -> dict:
    """Medians over the repeats; each repeat a fresh capture, its predictions (each
    statistic, and `baseline`'s whatif where given) and the target's run right after."""
    source, config = _toml(folder, captured), _toml(folder, target)
    real, fastest, seconds, ranges = [], [], [], []
    predicted: dict[str, list[float]] = {k: [] for k in (*STATISTICS, OFF, "baseline")}
    for _ in range(repeats):
        capture = folder / f"capture-{source.stem}"
        _parasim("run", source, "--out", capture, "--steps", 1, "--force")
        for statistic in STATISTICS:
            began = time.perf_counter()
            what = _parasim("whatif", capture, *_settings(target), "--statistic", statistic)
            predicted[statistic].append(what["step_time_predicted_s"])
            if statistic == STATISTICS[0]:
                seconds.append(time.perf_counter() - began)
                ranges.append(what["step_time_range_s"])
        predicted[OFF].append(_parasim("whatif", capture, *_settings(target), "--stragglers",
                                       "off")["step_time_predicted_s"])
        if baseline is not None:
            predicted["baseline"].append(_baseline(baseline, capture, target))
        mid, best = _measured(folder, config, steps)
        real.append(mid)
        fastest.append(best)
    mid = statistics.median(real)
    errors = {k: statistics.median((p - r) / r for p, r in zip(v, real))
              for k, v in predicted.items() if v}
    first = [(p - r) / r for p, r in zip(predicted[STATISTICS[0]], real)]
    i = first.index(statistics.median_low(first))
    return {"measured": mid, "fastest": min(fastest), "predicted": predicted[STATISTICS[0]][i],
            "range": ranges[i], "simulate": _parasim("simulate", config)["step_time_s"],
            "noise": statistics.median(abs(r - mid) / mid for r in real),
            "seconds": statistics.median(seconds), "errors": errors}


def _baseline(root: Path, capture: Path, target: dict[str, int]) -> float:
    """`root`'s whatif of `target` from `capture` as it is (the same inputs as this
    checkout's: the cluster's `cores` too), or, where `root` is older and refuses the
    capture, from `_as_older`'s copy."""
    try:
        what = _parasim("whatif", capture, *_settings(target), root=root)
    except SystemExit:
        what = _parasim("whatif", _as_older(capture), *_settings(target), root=root)
    return float(what["step_time_predicted_s"])


def _as_older(capture: Path) -> Path:
    """A copy of `capture` an older parasim reads: its cluster table without the `cores` key
    (`parasim run` records the host's since the time-sharing model), which an older one
    refuses as unknown; the link probe, an entry it does not read, stays."""
    older = capture.with_name(capture.name + "-older").resolve()
    older.mkdir(exist_ok=True)
    for path in capture.glob("rank*.json"):
        data = json.loads(path.read_text())
        data["meta"].get("cluster_spec", {}).pop("cores", None)
        (older / path.name).write_text(json.dumps(data))
    return older


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another parasim checkout (e.g. an "
                        "older commit's) whose default whatif is printed beside, as before")
    parser.add_argument("--only", action="append", metavar="TEXT", help="run only the "
                        "pairs whose name contains TEXT (repeatable; the control always runs)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, captured, target in _selected(args.only):
            rows.append((name, _pair(Path(tmp), captured, target, args.repeats, args.steps,
                                     args.baseline)))
            _print_row(*rows[-1])
    pairs = [r for _, r in rows[1:]]
    medians = {k: 100 * statistics.median(abs(r["errors"][k]) for r in pairs)
               for k in pairs[0]["errors"]}
    plain = 100 * statistics.median(abs(r["simulate"] - r["measured"]) / r["measured"]
                                    for r in pairs)
    print(f"median |error| over the {len(pairs)} pairs: whatif "
          + ", ".join(f"--statistic {k} {v:.1f}%" if k in STATISTICS else f"{k} {v:.1f}%"
                      for k, v in medians.items())
          + f"; simulate {plain:.1f}%; noise floor "
          f"{100 * statistics.median(r['noise'] for _, r in rows):.1f}%; the control's error "
          f"{100 * rows[0][1]['errors'][STATISTICS[0]]:+.1f}%")


def _selected(only: list[str] | None) -> list[tuple[str, dict[str, int], dict[str, int]]]:
    """The control and the pairs whose name contains one of `only` (all: None)."""
    return [PAIRS[0]] + [p for p in PAIRS[1:] if only is None or any(t in p[0] for t in only)]


def _print_row(name: str, r: dict) -> None:
    low, high = r["range"]
    others = "  ".join(f"{k} {100 * e:+.0f}%" for k, e in r["errors"].items()
                       if k != STATISTICS[0])
    print(f"{name:<26} measured {r['measured'] * 1e3:6.1f} ms (noise ±{100 * r['noise']:4.1f}%)"
          f"  whatif {r['predicted'] * 1e3:6.1f} ms [{low * 1e3:.1f}, {high * 1e3:.1f}] "
          f"({100 * r['errors'][STATISTICS[0]]:+.0f}%, {r['seconds']:.1f} s)  {others}  "
          f"simulate {r['simulate'] * 1e3:6.1f} ms "
          f"({100 * (r['simulate'] - r['measured']) / r['measured']:+.0f}%)", flush=True)


if __name__ == "__main__":
    main()
