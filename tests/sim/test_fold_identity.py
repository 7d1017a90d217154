"""Folding by identity (`traces.identity`) against the unfolded run: a named slow node folds
into its own classes and every representative's ops start and end exactly as unfolded."""

import pytest

from sim.config import experiment_from_dict
from sim.engine.replay import replay
from sim.models.compute import ComputeModel
from sim.simulate import predict
from traces.identity import partition
from traces.plan import build


def experiment(tp: int, pp: int, dp: int, zero: int = 0):
    world = tp * pp * dp
    return experiment_from_dict({
        "model": {"layers": 4, "hidden": 512, "heads": 16, "seq_len": 512, "vocab": 4096},
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "micro_batch": 1, "global_batch": 4 * dp,
                     "zero": zero},
        "cluster": {"preset": "dgx-h100", "nodes": max(1, world // 8), "fabric": "rail"}})


@pytest.mark.parametrize(("tp", "pp", "dp", "zero", "slow", "classes"), [
    (1, 1, 16, 3, 1, [0, 8]),            # ZeRO-3, DP 16 over 2 nodes, node 1 slow
    (2, 2, 4, 0, 1, [0, 8]),             # the slow node is stage 1: the uniform fold's classes
    (2, 2, 8, 0, 1, [0, 8, 16, 24]),     # stage 0 of dp 4-7 slow; stage 1 after it apart
    (1, 2, 16, 0, 2, [0, 8, 16, 24]),    # 32 ranks, stage 1's second node slow
    (4, 1, 8, 3, 3, [0, 24]),            # TP 4, ZeRO-3, the last of 4 nodes slow
])
def test_a_slow_node_folded_by_identity_equals_the_unfolded_run(tp, pp, dp, zero, slow,
                                                                  classes):
    exp = experiment(tp, pp, dp, zero)
    speeds = {r: 1.5 if r // 8 == slow else 1.0 for r in range(exp.layout.world)}
    unfolded, every = predict(exp, fold=False, speeds=speeds)
    folded, reps = predict(exp, fold=True, speeds=speeds)
    assert sorted(reps.plan.ops) == classes
    assert folded.step_time_s == unfolded.step_time_s
    for r in classes:
        assert reps.starts[r] == every.starts[r] and reps.ends[r] == every.ends[r]
    for name in ("compute_s", "exposed_comm_s", "bubble_fraction", "hardware_tflops_per_gpu",
                 "variability_s"):  # class-weighted means: the same sums in another order
        assert getattr(folded, name) == pytest.approx(getattr(unfolded, name), rel=1e-9,
                                                      abs=1e-15), name
    # the plan holds (and the op cap counts) the representatives' ops only
    assert reps.plan.num_ops() == sum(len(every.plan.ops[r]) for r in classes)


@pytest.mark.parametrize(("tp", "pp", "dp"), [(2, 2, 4), (1, 4, 8), (8, 2, 2)])
def test_equal_speeds_fold_as_today(tp, pp, dp):
    exp = experiment(tp, pp, dp)
    today, old = predict(exp)
    same = {r: 1.0 for r in range(exp.layout.world)}
    folded, new = predict(exp, speeds=same)
    unfolded, every = predict(exp, fold=False, speeds=same)
    assert sorted(new.plan.ops) == exp.layout.representatives()
    assert folded.step_time_s == today.step_time_s == unfolded.step_time_s
    assert new.ends == old.ends


def test_every_rank_its_own_class_is_the_unfolded_replay():
    exp = experiment(2, 2, 4)
    plan = build(exp.model, exp.layout)
    compute = ComputeModel(exp.cluster.accelerator, exp.profile)
    singletons = partition(exp.layout, key=lambda r: r)
    alone = replay(plan, exp.cluster, compute, fold=singletons)
    assert alone.ends == replay(plan, exp.cluster, compute).ends
