"""HybridEP simulated: it moves DeepEP's flows where a server is an 8-GPU node, and sends a
token between NVL72 racks once per destination rack (its plan folds exactly and carries its
routing: `test_deepep_step`)."""

from __future__ import annotations

import copy

import pytest

from sim.config import experiment_from_dict
from sim.simulate import predict

CONFIG = {
    "model": {"layers": 2, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 4096,
              "ffn": "swiglu", "ffn_hidden": 1024, "experts": 32, "top_k": 4,
              "moe_ffn_hidden": 256, "bias": False, "dispatch": "hybridep"},
    "parallel": {"dp": 16, "ep": 16, "global_batch": 16},
    "cluster": {"preset": "dgx-h100", "nodes": 2, "fabric": "rail"},
}


def _config(cluster: dict | None = None, **model):
    out = copy.deepcopy(CONFIG)
    out["model"].update(model)
    out["cluster"] = cluster or out["cluster"]
    return out


def test_on_8_gpu_nodes_hybridep_is_deepep():
    hybrid, _ = predict(experiment_from_dict(CONFIG))
    deep, _ = predict(experiment_from_dict(_config(dispatch="deepep")))
    nccl, _ = predict(experiment_from_dict(_config(dispatch="nccl")))
    assert hybrid.step_time_s == deep.step_time_s < nccl.step_time_s


def _racks(dispatch: str):
    """EP 144 over 2 GB200 NVL72 racks: two NVLink domains of 72 GPUs, one expert each."""
    return experiment_from_dict({**_config({"preset": "gb200-nvl72", "nodes": 2},
                                           dispatch=dispatch, experts=144),
                                 "parallel": {"dp": 144, "ep": 144, "global_batch": 144}})


def test_over_two_nvl72_domains_hybridep_folds_exactly_and_beats_nccl():
    folded, _ = predict(_racks("hybridep"), fold=True)
    unfolded, _ = predict(_racks("hybridep"), fold=False)
    assert folded.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-9)
    nccl, _ = predict(_racks("nccl"))
    assert folded.step_time_s < nccl.step_time_s  # a token crosses racks once, not per expert
