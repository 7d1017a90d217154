"""Hostile values of reshard_after_forward and grad_sync through `parasim simulate`
(tests/test_hostile_inputs.py's rule: one line naming the field, the value and the rule,
exit 2), and a config stating them simulated with the memory they cost."""

from __future__ import annotations

import json

import pytest

from sim.models.memory import gathered_params
from tests.test_hostile_inputs import SMALL, refused, run, toml
from traces.layout import Layout
from traces.model import ModelSpec


@pytest.mark.parametrize(("edits", "needle"), [
    ({"reshard_after_forward": "false"},
     "parallel.reshard_after_forward: false needs zero = 3 (FSDP), not 0"),
    ({"zero": "2", "reshard_after_forward": "false"},
     "parallel.reshard_after_forward: false needs zero = 3 (FSDP), not 2"),
    ({"zero": "3", "reshard_after_forward": "0"},
     "parallel.reshard_after_forward: 0 must be true or false"),
    ({"zero": "3", "reshard_after_forward": '"false"'},
     "parallel.reshard_after_forward: 'false' must be true or false"),
    ({"zero": "1", "grad_sync": '"microbatch"'},
     "parallel.grad_sync: \"microbatch\" needs zero = 2 or 3, not 1"),
    ({"grad_sync": '"microbatch"'}, "parallel.grad_sync: \"microbatch\" needs zero = 2 or 3"),
    ({"zero": "2", "grad_sync": '"Step"'},
     "parallel.grad_sync: 'Step' is not one of microbatch, step"),
    ({"zero": "3", "grad_sync": "true"}, "parallel.grad_sync: True is not one of microbatch"),
    ({"zero": "3", "grad_sync": "nan"}, "parallel.grad_sync: nan is not one of microbatch"),
    ({"zero": "3", "grad_sync": '["step"]'}, "parallel.grad_sync: ['step'] is not one of"),
])
def test_bad_values_and_the_wrong_stage_are_one_line(capsys, write, edits, needle):
    refused(capsys, needle, "simulate", write(toml(SMALL, parallel=edits)))


def test_a_config_with_both_keys_simulates_with_their_memory(capsys, write):
    def memory(**edits: str) -> list[dict]:
        code, out, err = run(capsys, "simulate", write(toml(SMALL, parallel=edits)), "--json")
        assert code == 0, err
        return json.loads(out)["memory_by_pp_rank"]

    held = memory(zero="3", reshard_after_forward="false", grad_sync='"step"')
    default = memory(zero="3")
    assert [m["grads_bytes"] for m in held] == [4 * m["grads_bytes"] for m in default]  # dp 4
    model = ModelSpec(layers=4, hidden=256, heads=16, seq_len=128, vocab=1024)
    layout = Layout(tp=2, pp=2, dp=4, global_batch=16, zero=3, reshard_after_forward=False)
    layer = model.layer_params(2)
    for r, (h, d) in enumerate(zip(held, default)):  # every unit held; no layer's gradients
        assert h["working_bytes"] - d["working_bytes"] == \
            2 * gathered_params(model, layout, r) - (2 * 2 + 2) * layer
