"""Folding by network position (`sim.engine.position`): where the layout's blocks cut a fat
tree's leaves unevenly, ranks that sit differently fold apart and the folded run equals the
unfolded one; where every class sits alike, the uniform fold stays."""

import pytest

import sim.simulate
from sim.config import EXAMPLES, example_path, experiment_from_dict, load_experiment
from sim.engine.position import network_positions
from sim.simulate import predict


def experiment(tp: int, pp: int, dp: int, zero: int, nodes: int, routing: str = "dmodk",
               fabric: str = "fat-tree"):
    cluster = {"preset": "dgx-a100", "nodes": nodes, "fabric": fabric}
    if fabric == "fat-tree":
        cluster |= {"nodes_per_leaf": 4, "oversubscription": 2.0, "routing": routing}
    return experiment_from_dict({
        "model": {"layers": 12, "hidden": 512, "heads": 16, "seq_len": 512, "vocab": 4096},
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "micro_batch": 1, "global_batch": 2 * dp,
                     "zero": zero, "overlap_grad_reduce": True},
        "cluster": cluster})


UNEVEN = [  # (tp, pp, dp, zero, nodes): on leaves of 4 DGX nodes
    (2, 2, 12, 0, 6),   # stages of 3 nodes: node 0 sends to node 3 on its leaf, 1 and 2 across
    (4, 2, 6, 3, 6),    # the same with ZeRO-3
    (2, 4, 12, 0, 12),  # whole leaves, stages of 3 nodes
]


@pytest.mark.parametrize(("tp", "pp", "dp", "zero", "nodes"), UNEVEN)
def test_ranks_placed_differently_fold_apart_and_equal_the_unfolded_run(
        monkeypatch, tp, pp, dp, zero, nodes):
    exp = experiment(tp, pp, dp, zero, nodes)
    unfolded, every = predict(exp, fold=False)
    folded, reps = predict(exp)
    assert len(reps.plan.ops) > pp  # more than one class per stage
    assert folded.step_time_s == unfolded.step_time_s
    for r in reps.plan.ops:
        assert reps.starts[r] == every.starts[r] and reps.ends[r] == every.ends[r]
    # ... which the fold by pipeline stage alone missed
    monkeypatch.setattr(sim.simulate, "network_positions", lambda cluster, layout: None)
    uniform, _ = predict(exp)
    assert uniform.step_time_s != unfolded.step_time_s


def test_positions_are_distances_to_the_peers_not_places():
    exp = experiment(2, 2, 12, 0, 6)  # stage 0: nodes 0-2 (leaf 0); stage 1: node 3, nodes 4-5
    pos = network_positions(exp.cluster, exp.layout)
    assert pos is not None
    node0, node1, node2 = pos[0], pos[8], pos[16]  # stage 0, tp 0, on nodes 0, 1, 2
    assert node1 == node2 != node0  # 1 -> 4 and 2 -> 5 cross a spine, 0 -> 3 does not
    assert pos[0] == pos[1]  # TP peers on one server sit alike


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_shipped_examples_keep_the_uniform_fold(name):
    exp = load_experiment(example_path(name))
    assert network_positions(exp.cluster, exp.layout) is None


@pytest.mark.parametrize(("exp", "why"), [
    (experiment(8, 1, 12, 0, 12), "one stage over whole leaves"),
    (experiment(2, 2, 12, 0, 6, fabric="rail"), "rails look alike from every server"),
])
def test_where_every_class_sits_alike_the_uniform_fold_stays(exp, why):
    assert network_positions(exp.cluster, exp.layout) is None, why
