"""A search whose worker is stopped (SIGSTOP, a debugger) ends with one line instead of
waiting forever for the task the worker holds (issue 36's sweep). The parent waits for its
tasks in slices of `CHECK_S`, and between them reads each worker's state from /proc; a worker
found stopped at every check for `STOPPED_LIMIT_S` is a fault of the machine, not a slow
task (a task that runs, however long, is never cut)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any, TypeVar

from traces.errors import Fault

R = TypeVar("R")
CHECK_S = 1.0
STOPPED_LIMIT_S = 60.0
"""Long enough for a person who stopped a worker by hand (kill -STOP, then -CONT) to go on."""


def process_state(pid: int) -> str:
    """The one-letter state of process `pid` ('R', 'S', 'T' stopped, ...), '' if unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


class StoppedWatch:
    """Since when each worker has been seen stopped, over the checks of one wait."""

    def __init__(self) -> None:
        self.since: dict[int, float] = {}

    def check(self, pids: Iterable[int], now: float) -> None:
        """Raise `Fault` for a worker stopped at every check for STOPPED_LIMIT_S."""
        stopped = {pid for pid in pids if process_state(pid) == "T"}
        self.since = {pid: self.since.get(pid, now) for pid in stopped}
        for pid, since in self.since.items():
            if now - since >= STOPPED_LIMIT_S:
                raise Fault(f"search: worker process {pid} has been stopped (SIGSTOP or a "
                            f"debugger) for {now - since:,.0f} s; the search stopped")


def first_completed(pool: Any, pending: Sequence[Future[R]]
                    ) -> tuple[list[Future[R]], list[Future[R]]]:
    """Of `pending`: those finished (at least one, waiting for it) and those not, checking
    `pool`'s workers between slices of the wait."""
    watch = StoppedWatch()
    while True:
        finished, left = wait(pending, timeout=CHECK_S, return_when=FIRST_COMPLETED)
        if finished:
            return list(finished), list(left)
        watch.check(list(getattr(pool, "_processes", {}) or {}), time.monotonic())
