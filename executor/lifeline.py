"""How a rank ends with the process that launched it (`executor.launch`), however that ends.

    die_with_parent()            SIGKILL when the parent exits (PR_SET_PDEATHSIG, Linux)
    exit_with(launcher, store)   end within POLL_S of the launcher's death, siblings too

A local rank's parent is multiprocessing's fork server, not the launcher: the fork server
lives while any of its children hold its liveness pipe, so a `kill -9`ed launcher left ranks
and fork server waiting on each other until the job timeout. `exit_with` watches the launcher
itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: SIGKILL when the parent (the fork server) exits (Linux)."""
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


PARENT_GONE = 129
"""A rank's exit status when the process that launched it is gone (128 + SIGHUP's 1)."""
POLL_S = 0.25


def exit_with(launcher: int, store: str | None = None) -> None:
    """End this rank, its sibling ranks and the rendezvous folder `store` within POLL_S of
    `launcher`'s death, however it died (`kill -9`).

    PR_SET_PDEATHSIG alone is not enough: a rank's parent is the fork server, which lives
    while any of its children hold its liveness pipe (multiprocessing hands each one the
    write end), so after the launcher's `kill -9` the ranks waited for the fork server and
    the fork server for them, until the job timeout. A pidfd (Linux 5.3) becomes readable
    when the launcher exits; elsewhere the rank polls for it. The first rank to see it ends
    its siblings too (the fork server's other children: one fork server per launcher, so
    they are this job's ranks), stopped ones included, which could not see it themselves."""
    server = os.getppid()

    def gone() -> bool:
        try:
            os.kill(launcher, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False

    def end() -> None:
        if server != launcher and os.getppid() == server:  # still the fork server's child
            for sibling in _children(server) - {os.getpid()}:
                with contextlib.suppress(OSError):
                    os.kill(sibling, signal.SIGKILL)
        if store is not None:
            with contextlib.suppress(OSError):
                remove_tree(store)
        os._exit(PARENT_GONE)

    def watch() -> None:
        pidfd = None
        with contextlib.suppress(OSError, AttributeError):
            pidfd = os.pidfd_open(launcher)
        if pidfd is not None:
            select.select([pidfd], [], [])
            end()
        while not gone():
            time.sleep(POLL_S)
        end()
    threading.Thread(target=watch, daemon=True, name="parasim-parent").start()


def _children(pid: int) -> set[int]:
    """`pid`'s children (Linux's /proc; none found elsewhere)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as file:
                found |= {int(c) for c in file.read().split()}
    return found


def remove_tree(path: str) -> None:
    """A flat folder and its files, as far as they can go (the rendezvous)."""
    with contextlib.suppress(OSError):  # gone already: a rank of a killed launcher took it
        for name in os.listdir(path):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(path, name))
    with contextlib.suppress(OSError):
        os.rmdir(path)
