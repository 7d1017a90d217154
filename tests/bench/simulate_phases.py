"""Where one `parasim simulate` spends its CPU: process seconds per phase, as one JSON object.

    python tests/bench/simulate_phases.py CONFIG.toml [--set K=V ...]

Runs `python -m sim simulate CONFIG --json ...` in this process with a timer (`time.process_time`)
around each phase's function as `sim.simulate.predict` and the command call them, and prints the
seconds per phase on stdout (the simulation's own output is discarded). `bench_moe_speed.py
--phases` runs it once per repeat and prints the medians. The phases:

  import       importing the command line, the simulator and its libraries
  config       reading the TOML and the `--set` keys (`load_set_experiment`)
  partition    the fold: network positions, identity classes, the CP and mirror folds
  plan         the schedule and the plan builder (`traces.plan.build`)
  durations    the compute model and the interference (`plan_compute`, `reserved_sms`, ...)
  lowering     the collectives lowered to flow sets (`sim.engine.lowering.lower_communication`)
  steps        each rank's ops cut into the replay's steps (`sim.engine.steps.rank_steps`)
  loop         the event loop (`sim.engine.loop.Loop.run`)
  memory       the memory model (`memory_by_pp_rank`)
  summary      the step's summary (`sim.metrics.summarize`)
  output       the JSON object and its printing
  other        the rest of `total` (argument parsing, the plan's header, ...)

A refused case (the op cap) prints {"refused": its line, ...} with the phases it got through.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from collections.abc import Callable
from typing import Any

START = time.process_time()

import sim.cli as cli  # noqa: E402  (imported after START: the import is a phase)
import sim.commands.simulate as command  # noqa: E402
import sim.engine.loop as loop  # noqa: E402
import sim.engine.replay as replay  # noqa: E402
import sim.simulate as simulate  # noqa: E402

PHASES: dict[str, tuple[tuple[Any, str], ...]] = {
    "config": ((command, "load_set_experiment"),),
    "partition": tuple((simulate, name) for name in (
        "network_positions", "partition_for", "over_cp", "mirror_fold")),
    "plan": ((simulate, "layout_schedule"), (simulate, "build")),
    "durations": tuple((simulate, name) for name in (
        "plan_compute", "reserved_sms", "interference_for", "spared", "expected_speeds",
        "host_programs")),
    "lowering": ((replay, "lower_communication"),),
    "steps": ((replay, "rank_steps"),),
    "loop": ((loop.Loop, "run"),),
    "memory": ((simulate, "memory_by_pp_rank"),),
    "summary": ((simulate, "summarize"),),
    "output": ((command, "summary_json"), (command, "emit")),
}
"""Per phase, the (module or class, function name) timed as it: each looked up by its
caller at call time, so replacing the attribute times every call."""


def timed(seconds: dict[str, float], phase: str, function: Callable[..., Any]
          ) -> Callable[..., Any]:
    """`function`, adding its process seconds to `seconds[phase]`."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[phase] = seconds.get(phase, 0.0) + time.process_time() - t
    return wrapper


def main(argv: list[str]) -> None:
    seconds: dict[str, float] = {"import": time.process_time() - START}
    for phase, places in PHASES.items():
        for owner, name in places:
            setattr(owner, name, timed(seconds, phase, getattr(owner, name)))
    out, err = io.StringIO(), io.StringIO()
    begin = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["simulate", *argv, "--json"])
    total = seconds["import"] + time.process_time() - begin
    result: dict[str, Any] = {p: round(seconds.get(p, 0.0), 3) for p in ("import", *PHASES)}
    result["other"] = round(total - sum(seconds.values()), 3)
    result["total"] = round(total, 3)
    if status == 2:
        result["refused"] = err.getvalue().strip().splitlines()[-1]
    elif status != 0:
        raise SystemExit(err.getvalue())
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
