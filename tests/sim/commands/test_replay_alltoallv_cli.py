"""A skewed MoE's trace carries its uneven all-to-alls (`split`): replayed, it gives simulate's
step; a split that breaks a rule is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.config import experiment_from_dict
from sim.simulate import predict
from tests.sim.test_moe_step import _config
from traces.io import save


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    exp = experiment_from_dict(_config(model={"routing_skew": 1.0},
                                       parallel={"tp": 1, "sp": False, "dp": 4, "ep": 4}))
    summary, times = predict(exp, fold=False)
    path = tmp_path_factory.mktemp("skew") / "trace.json"
    save(times.timed_trace(), path)
    return summary, path


def test_the_skewed_trace_replays_to_simulates_step(skewed, capsys):
    summary, path = skewed
    assert '"split":' in path.read_text()
    assert main(["replay", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_predicted_s"] == pytest.approx(summary.step_time_s, rel=1e-12)


def test_a_split_not_adding_up_is_one_line_and_exit_2(skewed, capsys, tmp_path):
    _, path = skewed
    document = json.loads(path.read_text())
    ops = document["ranks"]["0"]
    index = next(i for i, op in enumerate(ops) if "split" in op)
    ops[index]["split"]["sizes"][0] += 1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    assert main(["replay", str(bad), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"{bad}: rank 0, op {index}, field 'split': sizes add up to" in err
