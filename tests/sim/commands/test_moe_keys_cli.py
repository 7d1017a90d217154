"""`[model]` MoE keys and `[parallel]` ep, etp from the command line: each bad value one line and
exit 2; good ones shown in the summary and the --json layout."""

from __future__ import annotations

import json

import pytest

from tests.test_hostile_inputs import SMALL, refused, run, toml

MOE = {**SMALL, "model": {**SMALL["model"], "ffn": '"swiglu"', "ffn_hidden": "512",
                          "experts": "8", "top_k": "2", "moe_ffn_hidden": "128",
                          "shared_experts": "1", "dense_layers": "1"},
       "parallel": {**SMALL["parallel"], "sp": "true", "ep": "4"}}


@pytest.mark.parametrize(("edits", "needle"), [
    ({"model": {"top_k": "9"}}, "model.top_k: 9 must be from 1 to model.experts = 8"),
    ({"model": {"routing_skew": "-1"}}, "model.routing_skew: -1 must be a number from 0"),
    ({"model": {"routing_skew": "nan"}}, "model.routing_skew: nan must be a number"),
    ({"model": {"capacity_factor": "-0.5"}}, "model.capacity_factor: -0.5 must be a number"),
    ({"model": {"experts": "1e9"}}, "model.experts: 1000000000.0 must be an integer"),
    ({"model": {"dense_layers": "4"}}, "model.dense_layers: 4 must be fewer than"),
    ({"parallel": {"ep": "3"}}, "parallel.ep: etp 1 x ep 3 = 3 does not divide tp x cp x dp"),
    ({"parallel": {"ep": "0"}}, "parallel.ep: 0 must be an integer from 1"),
    ({"parallel": {"ep": "8", "etp": "2"}}, "parallel.ep: etp 2 x ep 8 = 16 does not divide"),
    ({"parallel": {"sp": None}}, "parallel.sp: an MoE model at tp 2 needs sp = true"),
])
def test_bad_moe_values_are_one_line_and_exit_2(capsys, write, edits, needle):
    refused(capsys, needle, "simulate", write(toml(MOE, **edits)))


def test_moe_shows_in_the_summary_and_the_json(capsys, write):
    path = write(toml(MOE, model={"routing_skew": "1.0"}))
    code, out, err = run(capsys, "simulate", path)
    assert code == 0, err
    assert "TP 2 · PP 2 · DP 4 · EP 4" in out
    assert "MoE 8 experts top-2 of 128 + 1 shared, 1 dense layers, dropless, skew 1" in out
    code, out, err = run(capsys, "simulate", path, "--json")
    assert json.loads(out)["layout"]["ep"] == 4
