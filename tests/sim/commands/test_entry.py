"""The console script's entry: Ctrl-C while `sim.cli` is still importing is one line, 130."""

import json
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


def test_keep_until_exit_holds_nothing_in_process():
    """Only the console script's run holds what a command keeps (it ends the process then);
    a command called in-process (tests, a library) frees it as ever."""
    from sim import entry

    entry.keep_until_exit(object())
    assert entry._KEPT == []


def test_a_finished_command_ends_at_once_with_its_output_whole():
    """`end_at_once`: the process ends without the interpreter's teardown, its stdout flushed
    whole and its status kept (0 here; 2 for a refused config)."""
    tiny = "sim/examples/gpt-tiny-localhost.toml"
    done = subprocess.run([sys.executable, "-m", "sim", "simulate", tiny, "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0
    assert json.loads(done.stdout)["world"] == 4
    refused = subprocess.run([sys.executable, "-m", "sim", "simulate", "/nonexistent.toml"],
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2
    assert refused.stderr.startswith("parasim: error: /nonexistent.toml")
