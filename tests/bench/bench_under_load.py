"""The suite under a CPU-heavy load (issue 36, "Must show"): `pytest -m "not slow"` several times
in a row (default 3), and the whole suite once with --whole, while busy loops keep the cores
busy beside it. A flaky test (a wall-time assertion, a start-up race) fails here first.

    python tests/bench/bench_under_load.py                      # 3 x not-slow, one loop a core
    python tests/bench/bench_under_load.py --whole --load 4 --json load.json
    python tests/bench/bench_under_load.py --repeat 1 -- tests/traces   # a part of the suite

The load is --load processes (default: one per core this process may use), each a Python busy
loop, started before the first run and ended (by their own ids) after the last, whatever
happens. Each run prints one line: PASS or FAIL, pytest's counts, its wall time and the CPU
seconds the load took meanwhile (read from /proc: the load really ran beside it); a failed
run's FAILED/ERROR lines follow, and --logs DIR keeps each run's whole output (run<i>.log) for
the tracebacks. Exit 0 when every run passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUSY_LOOP = "while True:\n    pass\n"
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")
MAX_LOAD = 256


@dataclass(frozen=True)
class RunRecord:
    """One pytest run under the load: its verdict, counts, wall time and the load's CPU time."""

    name: str
    args: list[str]
    returncode: int
    counts: dict[str, int]
    wall_s: float
    load_cpu_s: float | None
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.returncode == 0

    def line(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in self.counts.items()) or "no counts"
        load = "" if self.load_cpu_s is None else f", load {self.load_cpu_s:,.0f} CPU-s"
        return (f"{'PASS' if self.passed else 'FAIL'}  {self.name:<12} {self.wall_s:8.1f} s  "
                f"{counts}{load}")


def pytest_counts(output: str) -> dict[str, int]:
    """pytest's closing counts ('2100 passed, 8 skipped, 30 deselected in 301.2s'), from the
    last line that has any; 'error' and 'errors' are one key."""
    for line in reversed(output.splitlines()):
        found = COUNT.findall(line)
        if found and (" in " in line or line.startswith("=")):
            return {("errors" if k == "error" else k): int(n) for n, k in found}
    return {}


def failure_lines(output: str) -> list[str]:
    """The short summary's 'FAILED ...' and 'ERROR ...' lines."""
    return [line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """User + system CPU seconds these processes have used (Linux /proc); None elsewhere."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        return total / ticks
    except (OSError, ValueError, IndexError):
        return None


class Load:
    """`count` busy-loop processes, ended by their own ids on exit."""

    def __init__(self, count: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP],
                                       stdin=subprocess.DEVNULL) for _ in range(count)]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()


def run_pytest(name: str, args: list[str], load: Load, log_path: Path | None = None
               ) -> RunRecord:
    """One pytest run from the repository root, its output kept in a temporary file (and
    copied to `log_path` when given)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    before = cpu_seconds(load.pids)
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                 *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait()
        except BaseException:  # Ctrl-C, SIGTERM: the run ends with us
            proc.kill()
            proc.wait()
            raise
        log.seek(0)
        output = log.read()
    if log_path is not None:
        log_path.write_text(output)
    wall = time.monotonic() - start
    after = cpu_seconds(load.pids)
    spent = None if before is None or after is None else after - before
    return RunRecord(name=name, args=args, returncode=code, counts=pytest_counts(output),
                     wall_s=wall, load_cpu_s=spent, failures=failure_lines(output))


def plan(repeat: int, whole: bool, extra: list[str]) -> list[tuple[str, list[str]]]:
    """The runs in order: `repeat` not-slow ones, then the whole suite once when asked."""
    runs = [(f"not-slow {i + 1}/{repeat}", ["-m", "not slow", *extra]) for i in range(repeat)]
    return runs + ([("whole suite", list(extra))] if whole else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="not-slow runs (default 3)")
    parser.add_argument("--whole", action="store_true", help="then the whole suite once")
    parser.add_argument("--load", type=int, default=len(os.sched_getaffinity(0)),
                        help="busy-loop processes beside the runs (default: one per core)")
    parser.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    parser.add_argument("--logs", metavar="DIR", help="keep each run's output as DIR/run<i>.log")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to every pytest run")
    args = parser.parse_args(argv)
    if not 0 <= args.repeat <= 100 or not 0 <= args.load <= MAX_LOAD:
        parser.error(f"--repeat must be 0 to 100 and --load 0 to {MAX_LOAD}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the load still ends
    records: list[RunRecord] = []
    cores = len(os.sched_getaffinity(0))
    print(f"under load: {args.load} busy loop(s) on {cores} core(s), "
          f"load average {os.getloadavg()[0]:.1f} before", flush=True)
    logs = None if args.logs is None else Path(args.logs)
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    with Load(args.load) as load:
        for i, (name, pytest_args) in enumerate(plan(args.repeat, args.whole,
                                                     args.pytest_args)):
            log_path = None if logs is None else logs / f"run{i + 1}.log"
            record = run_pytest(name, pytest_args, load, log_path)
            records.append(record)
            print(record.line(), flush=True)
            for line in record.failures:
                print(f"      {line}", flush=True)
    passed = sum(r.passed for r in records)
    print(f"{passed} of {len(records)} runs passed; {sum(r.wall_s for r in records):,.0f} s "
          "in all", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "load_processes": args.load, "load_pids": load.pids, "cores": cores,
            "runs": [{**asdict(r), "passed": r.passed} for r in records]}, indent=1) + "\n")
    return 0 if passed == len(records) else 1


if __name__ == "__main__":
    sys.exit(main())
