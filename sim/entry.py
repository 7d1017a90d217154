"""The `parasim` console script: Ctrl-C while the command line is still being imported exits
130 with one line, like Ctrl-C later (`sim.cli` imports numpy, simpy and networkx first)."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from sim.cli import main as cli_main
    except KeyboardInterrupt:
        if sys.stderr is not None:
            print("parasim: error: interrupted", file=sys.stderr)
        return 130
    return cli_main()
