"""An interrupted command ends even when the interrupt left a thread stuck (issue 36: a search
printed its one Ctrl-C line and then never exited, 1 run in 3 of the suite under load): the
interpreter joins every non-daemon thread at exit, so `sim.entry` waits a bounded time and then
ends the process itself. A stuck thread is stood in for by one that waits forever."""

from __future__ import annotations

import subprocess
import sys

import pytest

# The child patches the command to leave a thread running for `argv[2]` seconds ("inf": for
# ever, as a process pool's manager blocked on a pipe does) and to return `argv[1]`;
# `sim.entry.main` then decides how the process ends. Python's own exit (atexit) says so.
CHILD = """
import atexit, sys, threading, time
import sim.cli, sim.entry
def command():
    seconds = float(sys.argv[2])
    wait = threading.Event().wait if seconds == float("inf") else lambda: time.sleep(seconds)
    threading.Thread(target=wait, name="left running").start()
    print("one line", file=sys.stderr)
    print("output", flush=False)
    return int(sys.argv[1])
atexit.register(lambda: print("python's exit"))
sim.cli.main = command
sim.entry.STUCK_WAIT_S = float(sys.argv[3])
raise SystemExit(sim.entry.main())
"""

HANG_GUARD_S = 60  # far beyond any wait here: reaching it means the process never ended


def child(code: int, thread_s: float, wait_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, str(code), str(thread_s), str(wait_s)],
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.mark.parametrize("code", [130, 143, 129])
def test_an_interrupted_command_left_stuck_ends_with_its_status_and_output(code):
    """Ctrl-C (130), SIGTERM (143), SIGHUP (129): the status kept, stdout flushed, the line
    once, and the process ended by parasim (Python's exit never comes)."""
    done = child(code, float("inf"), 0.2)
    assert (done.returncode, done.stdout, done.stderr) == (code, "output\n", "one line\n")


def test_an_interrupted_command_whose_threads_end_exits_as_python_does():
    """A thread that ends within the wait is joined and Python's own exit runs."""
    done = child(130, 0.1, HANG_GUARD_S / 2)
    assert (done.returncode, done.stdout) == (130, "output\npython's exit\n")


def test_a_command_that_finished_is_not_ended_early():
    """Only an interrupted command is ended by parasim: one that finished waits for its
    threads as Python does, however long they take to end."""
    done = child(0, 0.5, 0.0)
    assert (done.returncode, done.stdout) == (0, "output\npython's exit\n")
