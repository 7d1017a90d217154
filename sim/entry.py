"""The `parasim` console script: Ctrl-C while the command line is still being imported exits
130 with one line, like Ctrl-C later (`sim.cli` imports numpy, simpy and networkx first).

SIGTERM and SIGHUP end the command as Ctrl-C does: they raise `Terminated` (a
KeyboardInterrupt), so every output written so far is removed, every rank and worker is
stopped and every temporary folder removed by the same code that handles Ctrl-C; the command
prints one line and exits 128 + the signal's number (143 for SIGTERM).

Once that line is printed nothing is left to write, so an interrupted command ends within
`STUCK_WAIT_S` even if the interrupt left a thread or a child process stuck (a process pool's
manager waiting on a pipe no worker will read again would otherwise hold the interpreter's
exit forever).

A command that has handed `keep_until_exit` what it built ends the process at once when it
finishes (`end_at_once`), its streams flushed, where no thread or child process is left to
wait for: the interpreter's own exit frees every object one by one, and what `simulate`
keeps (a step's plan and times: ~2·10^6 ops for the Folding paper's 16K-context row on 128
GPUs) would take seconds of CPU to free, a tenth of the run, for nothing. Other commands exit
as Python does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING

from traces.errors import Terminated

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

STUCK_WAIT_S = 10.0
"""How long an interrupted command waits at exit for the threads it started to end."""
INTERRUPTED = frozenset({128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP})
"""The exit statuses of a command ended by Ctrl-C, SIGTERM or SIGHUP (`sim.cli.main`)."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def catch_termination() -> None:
    """SIGTERM and SIGHUP raise `Terminated` in the main thread from now on."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminate)


_KEPT: list[object] = []
"""What commands hand `keep_until_exit` where the console script runs them (`main`)."""
_ARMED: list[bool] = []
"""Set (one entry) once `main` runs a command: the process then ends with it."""


def keep_until_exit(*objects: object) -> None:
    """Hold `objects` until the process ends, where the console script runs the command: it
    ends without freeing them (module docstring). Called in-process (tests, a library user),
    nothing is held."""
    if _ARMED:
        _KEPT.extend(objects)


def main() -> int:
    catch_termination()
    _ARMED.append(True)
    try:
        from sim.cli import main as cli_main
    except KeyboardInterrupt as err:
        if sys.stderr is not None:
            print(f"parasim: error: {_why(err)}", file=sys.stderr)
        return 128 + err.signum if isinstance(err, Terminated) else 130
    code = cli_main()
    if code in INTERRUPTED:
        end_promptly(code, STUCK_WAIT_S)
    else:
        end_at_once(code)
    return code


def end_at_once(code: int) -> None:
    """End the process with `code` now, its streams flushed, without the interpreter's
    teardown (module docstring), where the command handed `keep_until_exit` something to skip
    freeing; where it did not, or a thread or child process holds the exit, return: the
    interpreter's exit (its atexit handlers, a library's teardown) runs as it always has."""
    if not _KEPT or _holding_exit():
        return
    _flush()
    os._exit(code)


def end_promptly(code: int, wait_s: float) -> None:
    """Give the threads still running `wait_s` to end, then end the process with `code` at
    once if one has not: the interpreter would join it forever at exit."""
    deadline = time.monotonic() + wait_s
    for waited in _holding_exit():
        waited.join(max(0.0, deadline - time.monotonic()))
    if not _holding_exit():
        return
    _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to keep
            if stream is not None:
                stream.flush()


def _holding_exit() -> list[threading.Thread | BaseProcess]:
    """What the interpreter waits for at exit: every live non-daemon thread but this one, and
    every live non-daemon child process (multiprocessing joins those at exit)."""
    import multiprocessing  # noqa: PLC0415 (only on the way out: the start stays light)

    holding: list[threading.Thread | BaseProcess] = [
        thread for thread in threading.enumerate()
        if thread is not threading.current_thread() and not thread.daemon and thread.is_alive()]
    return holding + [child for child in multiprocessing.active_children() if not child.daemon]


def _why(err: KeyboardInterrupt) -> str:
    return f"terminated by {err.name}" if isinstance(err, Terminated) else "interrupted"
