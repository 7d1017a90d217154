"""`[parallel]` cp, cp_comm, pp_first_layers and pp_last_layers from the command line: each bad
value one line and exit 2; good ones shown in the summary and the --json layout."""

from __future__ import annotations

import json

import pytest

from tests.test_hostile_inputs import SMALL, refused, run, toml

CP = {**SMALL, "model": {**SMALL["model"], "seq_len": "256"},
      "parallel": {"tp": "2", "cp": "2", "pp": "2", "dp": "2", "global_batch": "16"}}


@pytest.mark.parametrize(("edits", "needle"), [
    ({"parallel": {"cp": "0"}}, "parallel.cp: 0 must be an integer from 1"),
    ({"parallel": {"cp": "1.5"}}, "parallel.cp: 1.5 must be an integer"),
    ({"parallel": {"cp": '"2"'}}, "parallel.cp: '2' must be an integer"),
    ({"parallel": {"cp": "3", "dp": "4"}}, "cp 3 x pp 2 x dp 4 = 48 ranks, but the cluster has 16"),
    ({"parallel": {"cp_comm": '"ring"'}}, "parallel.cp_comm: 'ring' is not one of p2p, all_gather"),
    ({"parallel": {"cp_comm": "1"}}, "parallel.cp_comm: 1 is not one of p2p, all_gather"),
    ({"model": {"seq_len": "250"}}, "parallel.cp: model.seq_len = 250 is not divisible by 2 x cp"),
    ({"model": {"attention": '"unfused"'}}, "parallel.cp: 2 needs model.attention = \"flash\""),
    ({"parallel": {"pp_first_layers": "-1"}}, "parallel.pp_first_layers: -1 must be"),
    ({"parallel": {"pp_last_layers": "1e9"}}, "parallel.pp_last_layers: 1000000000.0 must be"),
    ({"parallel": {"pp_first_layers": "true"}}, "parallel.pp_first_layers: True must be"),
    ({"parallel": {"pp_first_layers": "3", "pp_last_layers": "2"}},
     "parallel.pp_first_layers, parallel.pp_last_layers: model.layers 4 - "
     "parallel.pp_first_layers 3 - parallel.pp_last_layers 2 = -1 layers are left"),
    ({"parallel": {"pp_first_layers": "4"}},
     "parallel.pp_first_layers, parallel.pp_last_layers: model.layers 4 - "
     "parallel.pp_first_layers 4 - parallel.pp_last_layers 0 = 0 layers do not split"),
])
def test_bad_cp_and_uneven_values_are_one_line_and_exit_2(capsys, write, edits, needle):
    refused(capsys, needle, "simulate", write(toml(CP, **edits)))


def test_cp_and_an_uneven_split_show_in_the_summary_and_the_json(capsys, write):
    path = write(toml(CP, parallel={"cp_comm": '"all_gather"', "pp_first_layers": "1",
                                    "pp_last_layers": "3", "dp": None, "global_batch": "8"},
                      model={"layers": "4"}, cluster={"nodes": "1"}))
    code, out, err = run(capsys, "simulate", path)
    assert code == 0, err
    assert "TP 2 · CP 2 (all_gather) · PP 2 · DP 1" in out
    assert "pipeline layers     1 · 3 per pipeline rank (pp_first_layers 1, pp_last_layers 3)" \
        in out
    code, out, err = run(capsys, "simulate", path, "--json")
    layout = json.loads(out)["layout"]
    assert (layout["cp"], layout["cp_comm"], layout["pp_first_layers"],
            layout["pp_last_layers"]) == (2, "all_gather", 1, 3)
