"""The console script's entry: Ctrl-C while `sim.cli` is still importing is one line, 130."""

import subprocess
import sys

INTERRUPTED_IMPORT = """
import builtins, sys
real = builtins.__import__
def interrupting(name, *args, **kwargs):
    if name == "networkx":  # imported by sim.cli's dependencies, long before main() runs
        raise KeyboardInterrupt
    return real(name, *args, **kwargs)
builtins.__import__ = interrupting
from sim.entry import main
sys.exit(main())
"""


def test_ctrl_c_during_imports_is_one_line_and_130():
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT, "simulate"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130
    assert proc.stderr.strip().splitlines() == ["parasim: error: interrupted"]
    assert proc.stdout == ""
