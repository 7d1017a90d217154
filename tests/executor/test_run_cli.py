"""`parasim run` from the command line: the shipped CPU example for real, and its refusals."""

from __future__ import annotations

import importlib.util
import json

import pytest

from sim.cli import main
from sim.config import example_path
from traces.io import load


def test_the_shipped_cpu_example_runs_and_writes_traces_perfetto_opens(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", str(example_path("gpt-tiny-localhost.toml")), "--out", str(out),
                 "--json", "--timeout", "30"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["world"] == 4 and summary["backend"] == "gloo"
    assert len(summary["losses"]) == 1 and summary["step_time_s"] > 0
    for rank in range(4):
        trace = load(out / f"rank{rank}.json")
        assert trace.timed and trace.meta.get("complete") is True
    chrome = json.loads((out / "chrome.json").read_text())
    assert {event["ph"] for event in chrome["traceEvents"]} >= {"X", "M"}


@pytest.mark.parametrize(("flags", "message"), [
    (["--steps", "0"], "--steps: 0 must be from 1 to 1000"),
    (["--timeout", "0"], "--timeout: 0 must be from 1 s to 24 h"),
])
def test_bad_flags_are_one_line(tmp_path, capsys, flags, message):
    assert main(["run", "--out", str(tmp_path / "x"), *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"parasim: error: {message}\n"


def test_out_may_not_be_a_file(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["run", "--out", str(target)]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_a_world_larger_than_the_host_is_one_line(tmp_path, capsys):
    config = tmp_path / "big.toml"
    config.write_text("[model]\nlayers = 2\nhidden = 64\nheads = 4\nseq_len = 16\nvocab = 64\n"
                      "[parallel]\ndp = 16\nglobal_batch = 16\n"
                      "[cluster]\npreset = \"dgx-a100\"\nnodes = 2\n")
    assert main(["run", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "16" in err


def test_without_torch_run_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["run", "--out", str(tmp_path / "o")]) == 2
    assert "parasim run needs PyTorch" in capsys.readouterr().err
