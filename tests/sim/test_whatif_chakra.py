"""`parasim whatif` reads Chakra ET folders through `sim.measured.load_trace`: a plan that
`parasim export --chakra` wrote carries its job in its header and simulated times, not
measured ones, so what-if'ing it to another DP is `simulate` of that target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("google.protobuf")  # Chakra ET is protobuf

from sim.cli import main

JOB = """
[model]
layers = 2
hidden = 128
heads = 4
seq_len = 64
vocab = 512

[parallel]
dp = {dp}
micro_batch = 2
global_batch = 8

[cluster]
preset = "dgx-h100"
nodes = 1
gpus_per_node = {dp}
"""


def run_json(capsys, *argv: object) -> dict:
    code = main([str(a) for a in argv] + ["--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_an_exported_plan_whatif_to_another_dp_is_simulate_of_it(capsys, tmp_path: Path):
    source, target = tmp_path / "dp2.toml", tmp_path / "dp4.toml"
    source.write_text(JOB.format(dp=2))
    target.write_text(JOB.format(dp=4))
    et = tmp_path / "et"
    run_json(capsys, "export", "--config", source, "--chakra", et, "--no-fold")
    assert sorted(p.name for p in et.iterdir()) == ["comm_group.json", "dp2.0.et", "dp2.1.et"]
    mine = run_json(capsys, "whatif", et, "--config", target)
    theirs = run_json(capsys, "simulate", target)
    assert mine["step_time_predicted_s"] == pytest.approx(theirs["step_time_s"], rel=1e-9)
    assert "links_fitted_to_capture" not in mine  # simulated communication: no measurement
    assert set(mine["compute_ops_by_source"]) == {"measured"}  # the same shapes per rank
    same = run_json(capsys, "whatif", et)
    replayed = run_json(capsys, "replay", et)
    assert same["step_time_predicted_s"] == replayed["step_time_predicted_s"]
