"""The job's timeout counts from the moment every rank has started, not from the spawn: on a
loaded host the fork server's torch import alone can take longer than a short job's timeout.
`_collect` is driven here with pipes that never speak, so nothing depends on the host's speed."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

import executor.launch as launch
from executor.recorder import H_OP, H_STARTED, HEADER
from executor.watch import H_JOINED


@dataclass
class _Silent:
    """A rank's process that neither reports nor exits (its sentinel never fires)."""

    sentinel: object
    pid: int = 0
    exitcode: None = None


def _job(world: int):
    readers, keep, procs = [], [], []
    for _ in range(world):
        reader, writer = mp.Pipe(duplex=False)
        never, alive = mp.Pipe(duplex=False)
        readers.append(reader)
        keep += [writer, alive]  # held open: neither pipe is ever ready
        procs.append(_Silent(sentinel=never))
    records = {r: np.zeros(HEADER, dtype=np.int64) for r in range(world)}
    for buf in records.values():
        buf[H_OP] = -1
    return launch._Job(procs=procs, readers=readers), records, keep


def test_ranks_that_never_start_are_named_after_the_start_up_budget(monkeypatch):
    monkeypatch.setattr(launch, "STARTUP_S", 0.2)
    job, records, _keep = _job(2)
    records[0][H_STARTED] = 1  # rank 1 never gets there
    with pytest.raises(launch.JobFailed, match=r"^ranks 1 did not start within 0.2 s"):
        launch._collect(job, 2, 60.0, records, None)


def test_the_job_timeout_starts_when_the_last_rank_starts(monkeypatch):
    monkeypatch.setattr(launch, "STARTUP_S", 30.0)
    job, records, _keep = _job(2)
    records[0][H_STARTED] = 1
    late = threading.Timer(0.5, lambda: records[1].__setitem__(H_STARTED, 1))
    begin = time.monotonic()
    late.start()
    with pytest.raises(launch.JobFailed, match=r"^job timed out after 0.3 s \(rank 0 in "
                       r"start-up \(no op yet\), rank 1 in start-up"):
        launch._collect(job, 2, 0.3, records, None)
    # 0.3 s from the second rank's start at 0.5 s, not from the call: at least 0.8 s in all
    assert time.monotonic() - begin >= 0.8


def test_a_rank_past_the_rendezvous_is_not_named_in_start_up(monkeypatch):
    """A rank that joined the process group but records no op (several cases in one world
    write buffers of their own) is named as working, not as starting up."""
    job, records, _keep = _job(2)
    for buf in records.values():
        buf[H_STARTED] = 1
    records[1][H_JOINED] = 1
    with pytest.raises(launch.JobFailed, match=r"^job timed out after 0.2 s \(rank 0 in "
                       r"start-up \(no op yet\), rank 1 in its work \(no op recorded here\)\)"):
        launch._collect(job, 2, 0.2, records, None)
