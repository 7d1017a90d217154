"""`[parallel]` account_for_embedding, account_for_loss and pipeline_layout from the command
line: each bad value one line and exit 2; good ones shown in the summary and the --json
layout, and left out of it at their defaults."""

from __future__ import annotations

import json

import pytest

from tests.test_hostile_inputs import SMALL, refused, run, toml

PP4 = {**SMALL, "model": {**SMALL["model"], "layers": "6"},
       "parallel": {"tp": "2", "pp": "4", "dp": "2", "global_batch": "16"}}


@pytest.mark.parametrize(("edits", "needle"), [
    ({"account_for_embedding": '"yes"'}, "parallel.account_for_embedding: 'yes' must be true"),
    ({"account_for_loss": "1"}, "parallel.account_for_loss: 1 must be true or false"),
    ({"account_for_embedding": "true"},
     "model.layers + embedding = 7 is not divisible by pp = 4"),
    ({"account_for_loss": "true", "pp_last_layers": "1"},
     "cannot be set with pp_first_layers / pp_last_layers"),
    ({"pipeline_layout": "3"}, "parallel.pipeline_layout: 3 must be a string"),
    ({"pipeline_layout": '"Et|tt|tt|t"'}, "must hold the loss L exactly once"),
    ({"pipeline_layout": '"Et|tt|tt|tmL"'},
     "parallel.pipeline_layout: 1 MTP layers (m), but model.mtp_layers = 0"),
    ({"pipeline_layout": '"Et|tt|tt|L"'},
     "parallel.pipeline_layout: 5 transformer layers (t), but model.layers = 6"),
    ({"pipeline_layout": '"Et|t*9999999|tt|L"'}, "repetition count 9999999 at position 5"),
])
def test_bad_split_values_are_one_line_and_exit_2(capsys, write, edits, needle):
    refused(capsys, needle, "simulate", write(toml(PP4, parallel=edits)))


def test_the_split_shows_in_the_summary_and_the_json(capsys, write):
    path = write(toml(PP4, parallel={"account_for_embedding": "true",
                                     "account_for_loss": "true"}))
    code, out, err = run(capsys, "simulate", path)
    assert code == 0, err
    assert "pipeline layers     1 · 2 x 2 · 1 per pipeline rank (account_for_embedding, " \
        "account_for_loss)" in out
    code, out, err = run(capsys, "simulate", path, "--json")
    layout = json.loads(out)["layout"]
    assert layout["account_for_embedding"] is layout["account_for_loss"] is True
    assert "pipeline_layout" not in layout
    stated = write(toml(PP4, parallel={"pipeline_layout": '"E|ttt|ttt|L"'}), "s.toml")
    code, out, err = run(capsys, "simulate", stated)
    assert code == 0, err
    assert "pipeline layers     0 · 3 x 2 · 0 per pipeline rank (pipeline_layout " \
        "'E|ttt|ttt|L')" in out
    repeated = write(toml(PP4, parallel={"pipeline_layout": '"Et|(tt|)*2tL"'}), "r.toml")
    code, out, err = run(capsys, "simulate", repeated)
    assert code == 0, err
    assert "1 · 2 x 2 · 1 per pipeline rank (pipeline_layout 'Et|(tt|)*2tL')" in out
