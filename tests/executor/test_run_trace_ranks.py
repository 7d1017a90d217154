"""`parasim run --trace-ranks`: every rank runs, only the chosen ranks' traces are written
(rank<r>.json, chrome.json, kernels-rank<r>.json), each holding that rank's whole plan; a bad
selection is one line before anything starts."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.options import RunOptions, as_run
from sim.cli import main
from sim.config import example_path, load_experiment
from traces.io import load
from traces.kineto import load_kineto
from traces.plan import build

TINY = example_path("gpt-tiny-localhost.toml")  # TP 2 x PP 2: 4 ranks


def test_only_the_chosen_ranks_are_written_and_each_holds_its_plan(tmp_path, capfd):
    out = tmp_path / "run"
    code = main(["run", str(TINY), "--out", str(out), "--trace-ranks", "0,3", "--kernels",
                 "--json", "--timeout", "60"])
    stdout, stderr = capfd.readouterr()
    assert code == 0, stderr
    summary = json.loads(stdout)
    written = {"rank0.json", "rank3.json", "chrome.json", "kernels-rank0.json",
               "kernels-rank3.json"}
    assert {p.name for p in out.iterdir()} == written
    assert sorted(str(out / name) for name in written) == sorted(summary["files"])
    assert sorted(summary["peak_memory_bytes"]) == ["0", "1", "2", "3"]  # every rank ran
    exp = load_experiment(TINY)
    plan = as_run(build(exp.model, exp.layout), RunOptions())
    for rank in (0, 3):
        trace = load(out / f"rank{rank}.json")
        assert trace.ranks == [rank] and trace.meta.complete is True
        assert [op.name for op in trace.ops[rank]] == [op.name for op in plan.ops[rank]]
        assert all(op.end is not None for op in trace.ops[rank])
        assert load_kineto(out / f"kernels-rank{rank}.json").ranks == [rank]
    chrome = json.loads((out / "chrome.json").read_text())
    assert {e["pid"] for e in chrome["traceEvents"] if e["ph"] == "X"} == {0, 3}


@pytest.mark.parametrize(("text", "message"), [
    ("4", "--trace-ranks: '4': '4' must be ranks from 0 to 3, a range low to high"),
    ("0,x", "--trace-ranks: '0,x' is not a list of ranks and ranges (write e.g. 0,8-15)"),
])
def test_a_bad_selection_is_one_line_and_nothing_starts(tmp_path, capsys, text, message):
    out = tmp_path / "run"
    assert main(["run", str(TINY), "--out", str(out), "--trace-ranks", text]) == 2
    assert capsys.readouterr().err == f"parasim: error: {message}\n"
    assert not out.exists()
