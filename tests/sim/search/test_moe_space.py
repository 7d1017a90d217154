"""The search space of an MoE model gains ep (and etp); a dense model's does not."""

from __future__ import annotations

import pytest

from sim.search.space import default_values, describe, read_space, reason_of, validate
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec

DENSE = ModelSpec(layers=8, hidden=1024, heads=16, seq_len=1024, vocab=8192)
MOE = ModelSpec(layers=8, hidden=1024, heads=16, seq_len=1024, vocab=8192, ffn="swiglu",
                ffn_hidden=2048, experts=16, top_k=2, moe_ffn_hidden=512, dense_layers=1)


def test_dense_models_search_no_expert_keys():
    assert "ep" not in default_values(DENSE, 8) and "etp" not in default_values(DENSE, 8)


def test_moe_models_search_ep_in_the_powers_of_two_dividing_the_experts():
    values = default_values(MOE, 8)
    assert values["ep"] == (1, 2, 4, 8, 16) and values["etp"] == (1,)
    space = read_space({"ep": [2, 4], "etp": [1, 2]}, {"global_batch": 64}, model=MOE,
                       world=16, devices_per_server=8)
    assert space.values["ep"] == (2, 4) and space.values["etp"] == (1, 2)


def test_candidates_are_pruned_by_the_ep_rules():
    table = {"tp": 1, "pp": 2, "dp": 8, "ep": 16, "global_batch": 64}
    with pytest.raises(ConfigError) as error:
        validate(table, MOE, world=16, devices_per_server=8)
    assert reason_of(error.value).startswith("parallel.ep: etp N x ep N = N does not divide")
    layout = validate({**table, "ep": 8}, MOE, world=16, devices_per_server=8)
    assert describe(layout) == "tp1 pp2 dp8 ep8 mb1 z0 none 1f1b"
    assert describe(Layout(dp=2, global_batch=2)) == "tp1 pp1 dp2 mb1 z0 none 1f1b"
