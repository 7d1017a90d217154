"""Issue 36's hostile sweep, orphans: after `kill -9` of a search with two workers, the
forkserver, the resource tracker and both workers were alive 241 s later. Each worker now
watches parasim's process (`sim.search.orphans`) and exits when it ends; the forkserver then
loses its last keep-alive pipe and ends too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sim.search import orphans

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 60.0  # a bound on a liveness wait, not a measured time: the ends come in ~1 s

CHILD = """
import sys, time
from multiprocessing import forkserver, resource_tracker
from sim.search.engines import Processes
from tests.test_hostile_orphans import sleeper

engine = Processes(2)
pending = engine.start(sleeper, None, [0, 1])
time.sleep(3)  # both workers started and running a task
pids = list(engine.pool._processes)
print(*pids, forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid,
      flush=True)
time.sleep(600)
"""


def sleeper(problem: object, item: int) -> int:
    time.sleep(600)
    return item


def ended(pid: int) -> bool:
    """Gone, or a zombie waiting for its parent."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_kill_9_of_the_search_ends_its_workers_forkserver_and_tracker():
    child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None
        *workers, server, tracker = map(int, child.stdout.readline().split())
        assert len(workers) == 2 and not any(map(ended, [*workers, server, tracker]))
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + DEADLINE_S
    while not all(map(ended, [*workers, server, tracker])) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in [*workers, server, tracker] if not ended(pid)]
    for pid in left:  # leave nothing behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert left == []


@pytest.mark.parametrize("pidfd", [True, False])
def test_wait_for_end_returns_once_the_process_ends(monkeypatch, pidfd):
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
        monkeypatch.setattr(orphans, "POLL_S", 0.05)
    sleep = subprocess.Popen(["sleep", "600"])
    watcher = threading.Thread(target=orphans.wait_for_end, args=(sleep.pid,), daemon=True)
    watcher.start()
    watcher.join(0.5)
    assert watcher.is_alive()  # still waiting while the process runs
    sleep.kill()
    sleep.wait()  # reaped, as parasim's shell reaps it: the pid is gone
    watcher.join(DEADLINE_S)
    assert not watcher.is_alive()


def test_a_process_already_gone_is_not_waited_for():
    done = subprocess.run(["true"], check=True)
    assert done.returncode == 0
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphans.wait_for_end(gone.pid)  # returns at once (pidfd_open fails, kill finds no one)


# --- a stopped worker ------------------------------------------------------------------------

def test_a_stopped_worker_ends_the_search_with_one_line(monkeypatch):
    from sim.search import stopped
    from sim.search.engines import Processes
    from traces.errors import Fault

    monkeypatch.setattr(stopped, "CHECK_S", 0.1)
    monkeypatch.setattr(stopped, "STOPPED_LIMIT_S", 1.0)
    engine = Processes(2)
    try:
        pending = engine.start(sleeper, None, [0, 1])
        deadline = time.monotonic() + DEADLINE_S
        while len(engine.pool._processes) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        victim = min(engine.pool._processes)
        os.kill(victim, signal.SIGSTOP)
        with pytest.raises(Fault, match=f"^search: worker process {victim} has been stopped "
                                        r"\(SIGSTOP or a debugger\) for 1 s; the search stopped"):
            pending.wait()
    finally:
        for pid in list(engine.pool._processes):
            os.kill(pid, signal.SIGCONT)
        engine.abort()


def test_a_worker_stopped_then_continued_is_not_a_fault():
    from sim.search.stopped import STOPPED_LIMIT_S, StoppedWatch

    sleep = subprocess.Popen(["sleep", "600"])
    try:
        watch = StoppedWatch()
        os.kill(sleep.pid, signal.SIGSTOP)
        time.sleep(0.2)
        watch.check([sleep.pid], 0.0)
        os.kill(sleep.pid, signal.SIGCONT)
        time.sleep(0.2)
        watch.check([sleep.pid], STOPPED_LIMIT_S - 1)  # running again: the clock restarts
        os.kill(sleep.pid, signal.SIGSTOP)
        time.sleep(0.2)
        watch.check([sleep.pid], STOPPED_LIMIT_S + 10)  # stopped anew only just now
        assert watch.since == {sleep.pid: STOPPED_LIMIT_S + 10}
    finally:
        sleep.kill()
        sleep.wait()
