"""Ctrl-C while the search's workers are still starting: one line, exit 130, and no worker
left to print a traceback from the forkserver's frames (issue 36: 3 of 6 tries by hand, 0.2-0.5 s
after the pool started)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.search.engines import Processes
from sim.search.orphans import children, end_forkserver_children
from tests.child import sigint_default

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(),
                                reason="needs Linux's /proc")


def nap(problem: object, seconds: float) -> float:
    """A task that holds its worker for `seconds`."""
    time.sleep(seconds)
    return seconds


def test_every_worker_the_forkserver_forked_is_ended_and_waited_for():
    engine = Processes(2)
    try:
        engine.start(nap, None, [30.0, 30.0])  # type: ignore[arg-type]
        recorded = set(engine.pool._processes)  # type: ignore[attr-defined]
        ended = end_forkserver_children()
        assert set(ended) == recorded and len(recorded) == 2
        states = [Path(f"/proc/{pid}/stat") for pid in ended]
        assert all(not s.exists() or s.read_text().rsplit(")", 1)[1].split()[0] in "ZX"
                   for s in states)
    finally:
        engine.abort()


def workers_of(pid: int) -> list[int]:
    """The search's worker processes: the children of parasim's children (the forkserver's)."""
    return [worker for child in children(pid) for worker in children(child)]


@pytest.mark.parametrize("delay_s", [0.0, 0.1, 0.3])
def test_ctrl_c_as_the_workers_start_prints_one_line(delay_s):
    proc = subprocess.Popen([sys.executable, "-m", "sim", "search", "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=sigint_default)
    deadline = time.monotonic() + 60
    while not workers_of(proc.pid):
        assert time.monotonic() < deadline and proc.poll() is None, "no worker started"
        time.sleep(0.005)
    time.sleep(delay_s)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", "parasim: error: interrupted\n")
