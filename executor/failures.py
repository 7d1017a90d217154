"""How a local job's ranks failed: each rank's failure, named by the op it was running, and
the job's (`JobFailed`), which keeps every rank's record buffer for partial traces."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from executor.recorder import FAILED, H_OP, H_STATE
from executor.watch import H_JOINED

# Errors a rank raises because another rank went away: not the cause of a failure.
PEER_ERRORS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
               "Socket closed", "DistNetworkError", "connection refused", "Timed out waiting",
               "timed out", "Timeout")


@dataclass(frozen=True, slots=True)
class RankFailure:
    rank: int
    op: str
    error: str
    cause: bool = True
    """False for an error the rank got because another rank failed first."""


class JobFailed(RuntimeError):
    """The job ended early; `records` holds every rank's buffer as it was."""

    def __init__(self, message: str, failures: Sequence[RankFailure],
                 records: dict[int, np.ndarray]) -> None:
        super().__init__(message)
        self.failures = list(failures)
        self.records = records
        self.files: list[Any] = []
        """Partial traces written by whoever caught it (executor.run)."""


def stopped_ranks(procs: Sequence[Any], ranks: set[int]) -> list[int]:
    """Of `ranks`, those whose process is stopped (state T or t in /proc: Linux only)."""
    stopped = []
    for rank in sorted(ranks):
        try:
            with open(f"/proc/{procs[rank].pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state in ("T", "t"):
            stopped.append(rank)
    return stopped


def failure(rank: int, message: tuple | None, proc: Any, records: dict[int, np.ndarray],
             describe: Callable[[int, int], str] | None) -> RankFailure:
    if message is not None:  # ("error", op, error text)
        _, op, error = message
        return RankFailure(rank, op or op_name(rank, records, describe), error,
                           cause=not any(p in error for p in PEER_ERRORS))
    proc.join(0.1)
    code = proc.exitcode
    how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else \
        f"exit code {code}"
    return RankFailure(rank, op_name(rank, records, describe), f"process died ({how})")


def op_name(rank: int, records: dict[int, np.ndarray],
             describe: Callable[[int, int], str] | None) -> str:
    index = int(records[rank][H_OP])
    if index < 0 and records[rank][H_JOINED]:
        # joined the process group: running work that records no op here (a test's several
        # cases write their own buffers), not starting up
        return "its work (no op recorded here)"
    if index < 0:
        return "start-up (no op yet)"
    return f"op {index} ({describe(rank, index)})" if describe else f"op {index}"


def mark_failed(records: dict[int, np.ndarray]) -> None:
    for buf in records.values():
        buf[H_STATE] = FAILED


def stopped_text(ranks: Sequence[int], records: dict[int, np.ndarray],
                 describe: Callable[[int, int], str] | None) -> str:
    """'rank 1 in op 17 (...) is stopped (SIGSTOP or a debugger)': ranks that cannot run."""
    where = ", ".join(f"rank {r} in {op_name(r, records, describe)}" for r in ranks)
    return f"{where} {'is' if len(ranks) == 1 else 'are'} stopped (SIGSTOP or a debugger)"
