"""The one exception type for a user's mistake, and how a value appears in its message.

Every package raises `ConfigError` for bad input (a config value, a flag, a file); the CLI turns
it into one line on stderr and exit status 2 (a `Fault`: exit 1). Internal invariants use
`assert` instead.
"""

import reprlib
import sys
from collections.abc import Iterable, Sequence


class ConfigError(ValueError):
    """Bad user input; the message names the field, the value and the rule."""


class Terminated(KeyboardInterrupt):
    """A signal (SIGTERM, SIGHUP) asked the command to end: raised in the main thread by
    `sim.entry`'s handler, and cleaned up after as Ctrl-C is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        import signal

        return signal.Signals(self.signum).name


class Fault(RuntimeError):
    """A fault of the machine, not of the input (a worker killed, a disk gone): the CLI prints
    the message as one line and exits 1."""


def warn(message: str) -> None:
    """One warning line on stderr, as the command line prints them: the run goes on."""
    if sys.stderr is not None:
        print(f"parasim: warning: {message}", file=sys.stderr)


_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxlong, _SHOW.maxother = 2, 40, 24, 40
_SHOW.maxlist = _SHOW.maxdict = _SHOW.maxtuple = _SHOW.maxset = 4


def show(value: object) -> str:
    """`repr` for an error line: short, one line, and safe on a 400-digit integer or a table
    nested 100,000 deep (plain `repr` is long or raises RecursionError)."""
    return _SHOW.repr(value)


def check_keys(table: Iterable[str], known: Sequence[str], where: str) -> None:
    """Reject keys of a config table that are not in `known`, naming the first one."""
    for key in table:
        if key not in known:
            raise ConfigError(f"{where}.{show(key)[1:-1]}: unknown key (known: {', '.join(known)})")
