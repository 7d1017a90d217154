"""bench_under_load.py: pytest's counts read back as pytest printed them, the runs in the order
asked (the not-slow ones with -m "not slow", then the whole suite), a failing run makes the
exit 1 and names its test, and the load's processes end with the script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_under_load import failure_lines, main, plan, pytest_counts

SUITE = '''
import pytest

def test_a(): assert 1 + 1 == 2
def test_b(): pass
@pytest.mark.slow
def test_slow(): pass
def test_fails(): assert 1 == 2
@pytest.mark.skip(reason="shown as skipped")
def test_skipped(): pass
'''


def test_counts_are_read_from_pytests_closing_line():
    out = ("....F\n=========== short test summary info ===========\n"
           "FAILED tests/x.py::test_y - assert 1 == 2\nERROR tests/z.py - ImportError\n"
           "1 failed, 2100 passed, 8 skipped, 30 deselected, 1 error in 301.25s (0:05:01)\n")
    assert pytest_counts(out) == {"failed": 1, "passed": 2100, "skipped": 8,
                                  "deselected": 30, "errors": 1}
    assert failure_lines(out) == ["FAILED tests/x.py::test_y - assert 1 == 2",
                                  "ERROR tests/z.py - ImportError"]
    assert pytest_counts("no tests ran in 0.01s\n") == {}


def test_the_runs_are_the_not_slow_ones_then_the_whole_suite():
    assert plan(2, True, ["tests/traces"]) == [
        ("not-slow 1/2", ["-m", "not slow", "tests/traces"]),
        ("not-slow 2/2", ["-m", "not slow", "tests/traces"]),
        ("whole suite", ["tests/traces"])]


@pytest.mark.slow  # two pytest runs beside a busy loop
def test_a_failing_run_is_exit_1_named_and_the_load_ends(tmp_path, capsys):
    suite, out = tmp_path / "test_suite.py", tmp_path / "load.json"
    suite.write_text(SUITE)
    logs = tmp_path / "logs"
    assert main(["--repeat", "1", "--whole", "--load", "1", "--json", str(out), "--logs",
                 str(logs), "--",
                 "-W", "ignore::pytest.PytestUnknownMarkWarning",
                 str(suite)]) == 1
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    first, whole = data["runs"]
    assert first["counts"] == {"failed": 1, "passed": 2, "skipped": 1, "deselected": 1}
    assert whole["counts"] == {"failed": 1, "passed": 3, "skipped": 1}
    assert first["passed"] is whole["passed"] is False
    named = first["failures"][0].partition(" - ")[0]
    assert named.startswith("FAILED ") and named.endswith("test_suite.py::test_fails")
    assert f"      {named}" in printed
    assert sorted(p.name for p in logs.iterdir()) == ["run1.log", "run2.log"]
    assert "def test_fails(): assert 1 == 2" in (logs / "run1.log").read_text()  # traceback
    assert printed.splitlines()[-1].startswith("0 of 2 runs passed")
    assert len(data["load_pids"]) == 1 and first["load_cpu_s"] >= 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in data["load_pids"])
