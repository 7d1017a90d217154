"""Routing as trained, simulated: a DeepEP plan carries its routing on every dispatch and
combine, folds exactly, and moves fewer InfiniBand bytes than NCCL's all-to-all (the executor
runs it: tests/executor/test_deepep_run.py); force_balance leaves a balanced step unchanged."""

from __future__ import annotations

import copy
import json

import pytest

from sim.cli import main
from sim.config import experiment_from_dict
from sim.simulate import predict
from traces.purpose import ExpertAllToAll

CONFIG = {
    "model": {"layers": 2, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 4096,
              "ffn": "swiglu", "ffn_hidden": 1024, "experts": 32, "top_k": 4,
              "moe_ffn_hidden": 256, "bias": False, "router_groups": 4,
              "router_group_topk": 2, "dispatch": "deepep"},
    "parallel": {"dp": 16, "ep": 16, "global_batch": 16},
    "cluster": {"preset": "dgx-h100", "nodes": 2, "fabric": "rail"},
}


def _config(**model):
    out = copy.deepcopy(CONFIG)
    out["model"].update(model)
    return out


@pytest.mark.parametrize("dispatch", ["deepep", "hybridep"])
def test_a_deepep_step_folds_exactly_and_names_its_dispatch(dispatch):
    exp = experiment_from_dict(_config(dispatch=dispatch))
    folded, times = predict(exp, fold=True)
    unfolded, _ = predict(exp, fold=False)
    assert folded.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-9)
    a2a = [op for op in times.plan.ops[0] if isinstance(op.purpose, ExpertAllToAll)]
    assert len(a2a) == 2 * 2 * 2  # dispatch and combine, forward and backward, 2 layers
    assert all(op.split is not None and op.split.deepep is not None for op in a2a)


def test_deepep_with_node_limited_routing_exposes_less_than_nccl():
    deep, _ = predict(experiment_from_dict(CONFIG))
    nccl, _ = predict(experiment_from_dict(_config(dispatch="nccl")))
    assert deep.step_time_s < nccl.step_time_s


def test_force_balance_leaves_a_balanced_step_as_it_was_and_balances_a_skewed_one():
    base = dict(dispatch="nccl")
    plain, _ = predict(experiment_from_dict(_config(**base)))
    forced, _ = predict(experiment_from_dict(_config(**base, force_balance=True)))
    skewed, _ = predict(experiment_from_dict(_config(**base, routing_skew=1.0,
                                                     force_balance=True)))
    assert forced.step_time_s == plain.step_time_s == skewed.step_time_s


def test_a_bad_dispatch_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    lines = []
    for table, values in _config(dispatch="nvshmem").items():
        lines.append(f"[{table}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["parasim: error: model.dispatch: 'nvshmem' is not one of nccl, deepep, hybridep"]
