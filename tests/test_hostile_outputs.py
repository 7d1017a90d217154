"""Issue 36's hostile sweep, stale outputs: a run that fails after its output paths were named
removes what an earlier run left at them, and its one line says so, so nobody opens
yesterday's report believing it is today's (goodput --report after a refused Monte-Carlo,
simulate --report/--trace after an error, Ctrl-C or SIGTERM mid-write)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sim.cli import main
from traces.errors import ConfigError, Terminated
from traces.files import Outputs, removed_note

SMALL = """[model]
layers = 4
hidden = 256
heads = 16
seq_len = 128
vocab = 1024
[parallel]
tp = 2
pp = 2
dp = 2
global_batch = 4
[cluster]
preset = "dgx-a100"
nodes = 1
"""


def earlier(path: Path) -> Path:
    path.write_text("from an earlier run")
    return path


def run(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_goodput_refused_monte_carlo_removes_the_earlier_report(tmp_path, capsys):
    config = tmp_path / "g.toml"
    config.write_text(SMALL + '[reliability]\nmtti = "1h"\n')
    report = earlier(tmp_path / "g.html")
    code, out, err = run(capsys, "goodput", config, "--days", 3000, "--report", report)
    assert (code, out) == (2, "")
    assert err == ("parasim: error: " + err.split("error: ", 1)[1].split("; removed")[0]
                   + f"; removed the earlier {report} so it is not taken for this run's "
                   "output\n")
    assert "the Monte-Carlo would draw about" in err
    assert sorted(os.listdir(tmp_path)) == ["g.toml"]


@pytest.mark.parametrize("flags", [("--report", "r.html"), ("--trace", "t.json"),
                                   ("--trace", "t.json", "--chrome", "c.json")])
def test_simulate_error_removes_every_earlier_output(tmp_path, capsys, flags):
    config = tmp_path / "s.toml"  # the HBM check fails inside the simulation
    config.write_text(SMALL + 'hbm_bandwidth = "500GB/s"\n')
    named = [earlier(tmp_path / name) for name in flags[1::2]]
    argv = [str(tmp_path / f) if f[0] != "-" else f for f in flags]
    code, out, err = run(capsys, "simulate", config, *argv)
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("parasim: error: cluster.hbm_bandwidth: 500 GB/s must be above")
    assert err.endswith(f"; removed the earlier {', '.join(map(str, named))} so it is not "
                        "taken for this run's output\n")
    assert sorted(os.listdir(tmp_path)) == ["s.toml"]


def test_a_failure_with_no_earlier_file_says_nothing_more(tmp_path, capsys):
    config = tmp_path / "s.toml"
    config.write_text(SMALL + 'hbm_bandwidth = "500GB/s"\n')
    code, _, err = run(capsys, "simulate", config, "--report", tmp_path / "r.html")
    assert code == 2 and "removed" not in err and err.count("\n") == 1


@pytest.mark.parametrize("raised", [ConfigError("x: 1 too big"), KeyboardInterrupt(),
                                    Terminated(15)])
def test_outputs_remove_named_files_on_any_failure(tmp_path, raised):
    old, other = earlier(tmp_path / "old.html"), earlier(tmp_path / "other.json")
    with pytest.raises(type(raised)) as caught, Outputs([old]) as outputs:
        outputs.write(tmp_path / "new.json", "half")  # mid-write: staged, never committed
        raise raised
    assert sorted(os.listdir(tmp_path)) == ["other.json"]  # only what was not named stays
    assert removed_note(caught.value) == (f"; removed the earlier {old} so it is not taken "
                                          "for this run's output")
    assert other.read_text() == "from an earlier run"


def test_a_successful_run_replaces_its_outputs_and_adds_no_note(tmp_path):
    old = earlier(tmp_path / "r.html")
    with Outputs([old]) as outputs:
        outputs.write(old, "today")
        outputs.commit()
    assert old.read_text() == "today"


def test_sigterm_line_names_what_was_removed(tmp_path, capsys, monkeypatch):
    config = tmp_path / "s.toml"
    config.write_text(SMALL)
    report = earlier(tmp_path / "r.html")

    def terminated(*args, **kwargs):
        raise Terminated(15)

    monkeypatch.setattr("sim.commands.simulate.predict", terminated)
    code, out, err = run(capsys, "simulate", config, "--report", report)
    assert (code, out) == (143, "")
    assert err == (f"parasim: error: terminated by SIGTERM; removed the earlier {report} so it "
                   "is not taken for this run's output\n")
    assert not report.exists()
