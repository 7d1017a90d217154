"""DualPipe's mirror fold (issue 33; `traces.mirror_fold`, `sim.engine.mirror_fold`):
simulating only the ranks with pp < pp/2 and copying their timelines to their mirrors gives
the step of the fold without it, byte for byte (`--json`), and the unfolded run's step time,
memory and per-rank results."""

from __future__ import annotations

import copy
import json

import pytest

import sim.simulate as simulate
from sim.config import experiment_from_dict
from sim.engine.mirror_placement import mirror_alike
from sim.simulate import predict, summary_json
from traces.layout import Layout, Schedule
from traces.mirror_fold import counted_for, mirror_groups, mirror_pairs

CONFIG = {
    "model": {"layers": 8, "hidden": 1024, "heads": 8, "seq_len": 1024, "vocab": 4096,
              "ffn": "swiglu", "ffn_hidden": 2048, "experts": 8, "top_k": 2,
              "moe_ffn_hidden": 512, "dense_layers": 0, "bias": False,
              "tied_embeddings": False},
    "parallel": {"pp": 4, "schedule": "dualpipe", "dp": 2, "ep": 2, "global_batch": 16,
                 "zero": 1},
    "cluster": {"preset": "dgx-h800", "nodes": 1},
}

CASES = [
    ({}, {}),
    ({"pp": 8, "dp": 1, "ep": 1, "zero": 0}, {}),
    ({"overlap_moe_comm": True}, {}),
    # over servers on a fat tree: two stages a server; a stage over two servers
    ({"dp": 4, "ep": 4, "global_batch": 64}, {"nodes": 2}),
    ({"dp": 8, "ep": 8, "global_batch": 64}, {"nodes": 4}),
    # rails, an expert grid the dp shifts do not close (folded by identity classes), TP 2
    ({"dp": 8, "ep": 4, "global_batch": 64}, {"preset": "dgx-h100", "nodes": 4,
                                              "fabric": "rail"}),
    ({"tp": 2, "sp": True}, {"preset": "dgx-h100", "nodes": 2, "fabric": "rail"}),
]


def _experiment(parallel: dict, cluster: dict):  # type: ignore[no-untyped-def]
    config = copy.deepcopy(CONFIG)
    config["parallel"].update(parallel)
    config["cluster"].update(cluster)
    return experiment_from_dict(config)


@pytest.mark.parametrize(("parallel", "cluster"), CASES)
def test_mirror_fold_equals_the_fold_without_it(parallel: dict, cluster: dict,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    exp = _experiment(parallel, cluster)
    replayed: list[int] = []
    half = simulate.half
    monkeypatch.setattr(simulate, "half",
                        lambda plan, fold: replayed.append(len(half(plan, fold).ops))
                        or half(plan, fold))
    folded, times = predict(exp)
    assert replayed == [exp.layout.pp // 2]  # only the first half's stages were replayed
    monkeypatch.setattr(simulate, "mirror_fold", lambda *_: None)
    plain, plain_times = predict(exp)
    assert json.dumps(summary_json(exp, folded)) == json.dumps(summary_json(exp, plain))
    assert times.starts == plain_times.starts and times.ends == plain_times.ends
    unfolded, _ = predict(exp, fold=False)
    assert folded.step_time_s == unfolded.step_time_s
    assert folded.memory_by_pp_rank == unfolded.memory_by_pp_rank
    every = {r.rank: r for r in unfolded.ranks}
    for r in folded.ranks:  # each representative, the mirrored half's included
        assert r == every[r.rank]


@pytest.mark.parametrize(("parallel", "why"), [
    ({"schedule": "1f1b", "global_batch": 16}, "not dualpipe"),
])
def test_no_mirror_fold_without_mirrors(parallel: dict, why: str) -> None:
    exp = _experiment(parallel, {})
    assert simulate.mirror_fold(exp.model, exp.layout, exp.cluster, None) is None, why


def test_skewed_routing_is_not_mirror_folded() -> None:
    """Per-rank routing draws set mirrors apart: the fold must not stand for them."""
    config = copy.deepcopy(CONFIG)
    config["model"]["routing_skew"] = 1.0
    exp = experiment_from_dict(config)
    assert simulate.mirror_fold(exp.model, exp.layout, exp.cluster, None) is None


def test_counts_and_images() -> None:
    """A collective of the simulated half stands for its mirror's too, except DualPipe's
    gradient reduction over both mirrors (its own mirror); the middle pair's mirror is the
    reverse transfer."""
    layout = Layout(pp=4, dp=2, schedule=Schedule.DUALPIPE, global_batch=16)
    stage0 = (0, 1)
    assert counted_for(layout, stage0) == 2
    assert counted_for(layout, (0, 1, 6, 7)) == 1
    assert counted_for(layout, None) == 2
    assert mirror_groups(layout, [stage0]) == [(6, 7)]
    assert mirror_groups(layout, [(0, 1, 6, 7)]) == []
    assert mirror_pairs(layout, [(2, 4)]) == [(4, 2)]


def test_mirror_alike_placements() -> None:
    """The swap of stage blocks is an automorphism of one server, of rails, of leaf-aligned
    fat-tree blocks; not of a block cut mid-server."""
    exp = _experiment({}, {})
    assert mirror_alike(exp.cluster, exp.layout)
    exp = _experiment({"dp": 8, "ep": 8, "global_batch": 64}, {"nodes": 4})
    assert mirror_alike(exp.cluster, exp.layout)
    three = Layout(pp=4, dp=3, schedule=Schedule.DUALPIPE, global_batch=48)  # 12 of 32 GPUs
    assert not mirror_alike(exp.cluster, three)
