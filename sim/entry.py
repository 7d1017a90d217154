"""The `parasim` console script: Ctrl-C while the command line is still being imported exits
130 with one line, like Ctrl-C later (`sim.cli` imports numpy, simpy and networkx first).

SIGTERM and SIGHUP end the command as Ctrl-C does: they raise `Terminated` (a
KeyboardInterrupt), so every output written so far is removed, every rank and worker is
stopped and every temporary folder removed by the same code that handles Ctrl-C; the command
prints one line and exits 128 + the signal's number (143 for SIGTERM).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from traces.errors import Terminated


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def catch_termination() -> None:
    """SIGTERM and SIGHUP raise `Terminated` in the main thread from now on."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminate)


def main() -> int:
    catch_termination()
    try:
        from sim.cli import main as cli_main
    except KeyboardInterrupt as err:
        if sys.stderr is not None:
            print(f"parasim: error: {_why(err)}", file=sys.stderr)
        return 128 + err.signum if isinstance(err, Terminated) else 130
    return cli_main()


def _why(err: KeyboardInterrupt) -> str:
    return f"terminated by {err.name}" if isinstance(err, Terminated) else "interrupted"
