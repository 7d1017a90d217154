"""`parasim replay` of a parasim trace whose numbers or size no step can have: one line on
stderr and exit 2 (issue 22 item 4). Run: pytest tests/sim/commands/test_replay_cli.py -q
"""

from __future__ import annotations

import json
import tomllib

import pytest

from sim.cli import main
from sim.simulate import predict
from tests.sim.commands.test_simulate_cli import SMALL
from traces import op_rules
from traces.io import save


@pytest.fixture(scope="module")
def trace_text(tmp_path_factory) -> str:
    from sim.config import experiment_from_dict

    _, times = predict(experiment_from_dict(tomllib.loads(SMALL)))
    path = tmp_path_factory.mktemp("replay") / "step.json"
    save(times.timed_trace(), path)
    return path.read_text()


def _replay(capsys, path) -> tuple[int, str, str]:
    code = main(["replay", str(path), "--json"])
    out, err = capsys.readouterr()
    return code, out, err


def _first(ops: list[dict], kind: str) -> int:
    return next(i for i, op in enumerate(ops) if op["kind"] == kind)


def test_the_trace_replays_as_written(capsys, tmp_path, trace_text):
    path = tmp_path / "step.json"
    path.write_text(trace_text)
    code, out, err = _replay(capsys, path)
    assert code == 0 and err == "" and json.loads(out)["num_ranks"] > 1


@pytest.mark.parametrize(("kind", "field", "value", "rule"), [
    ("all_reduce", "size_bytes", 5e-324, "must be 0 (unstated) or 1 to 1,099,511,627,776"),
    ("all_reduce", "size_bytes", 1e300, "must be 0 (unstated) or 1 to 1,099,511,627,776"),
    ("compute", "end", 1e308, "must be at most 86,400 s"),
    ("compute", "flops", 1e308, "must be at most 1e+22"),
])
def test_an_impossible_number_is_one_line_and_exit_2(capsys, tmp_path, trace_text, kind, field,
                                                     value, rule):
    document = json.loads(trace_text)
    ops = document["ranks"]["0"]
    index = _first(ops, kind)
    ops[index][field] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    code, out, err = _replay(capsys, path)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"{path}: rank 0, op {index}, field '{field}': {rule}" in err


def test_a_trace_past_the_op_bound_is_one_line_and_exit_2(capsys, tmp_path, trace_text,
                                                          monkeypatch):
    path = tmp_path / "big.json"
    path.write_text(trace_text)
    total = sum(len(ops) for ops in json.loads(trace_text)["ranks"].values())
    monkeypatch.setattr(op_rules, "MAX_TRACE_OPS", total - 1)
    code, out, err = _replay(capsys, path)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"the trace holds at least {total:,} ops" in err
