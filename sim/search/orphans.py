"""A search worker ends when the parasim process that started it ends, however it ends.

Workers are forked by multiprocessing's forkserver, not by parasim, and each holds the
forkserver's keep-alive pipe and the resource tracker's (CPython's `connect_to_new_process`
passes both to every child) while it blocks reading a task queue whose writing end it holds
too: after `kill -9` of parasim nothing ever wakes it, and it keeps the forkserver and the
resource tracker alive with it (both were alive 241 s later in issue 36's sweep). So each
worker watches parasim's process and exits when it is gone; the pipes then close and the
forkserver and the tracker end on their own.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from pathlib import Path

POLL_S = 1.0
"""Where the kernel has no pidfd (Linux before 5.3, other systems): how often to look."""
EXIT_STATUS = 1


def start_worker(parent: int) -> None:
    """A worker's initializer: Ctrl-C left to `parent` (it reaches the whole process group;
    the parent prints the one line and terminates its workers itself, and a worker interrupted
    mid-import would print a traceback), and the worker ends when `parent` does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=watch, args=(parent,), name="parasim-parent", daemon=True).start()


def watch(parent: int) -> None:
    """Return when process `parent` has ended; then end this process at once."""
    wait_for_end(parent)
    os._exit(EXIT_STATUS)  # no cleanup to run: the parent's abort would have stopped us


def wait_for_end(pid: int) -> None:
    """Block until process `pid` ends (a pidfd turns readable then), or poll for it."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here; or the process has already gone
        fd = None
    if fd is not None:
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)
        return
    while _alive(pid):
        time.sleep(POLL_S)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's (the pid was reused)
        return True
    return True


def end_forkserver_children() -> list[int]:
    """Terminate every process this process's forkserver has forked, those the pool has not
    recorded yet included, and wait for each: Ctrl-C while a worker is still starting would
    otherwise leave it to unpickle its task after parasim is gone and print a traceback from
    the forkserver's frames (issue 36). The pids ended, [] where there is no forkserver."""
    from multiprocessing import forkserver  # noqa: PLC0415 (Linux and macOS only)

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return []
    ended = children(pid)
    for child in ended:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)  # a starting worker may not yet ignore anything
    deadline = time.monotonic() + 5.0
    while any(_alive_child(child) for child in ended) and time.monotonic() < deadline:
        time.sleep(0.01)
    return ended


def children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux's /proc; [] where it cannot be read)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(word) for word in text.split()]


def _alive_child(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, waiting for its forkserver to reap it, has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
