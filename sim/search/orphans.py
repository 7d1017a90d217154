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

import os
import select
import signal
import threading
import time

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
