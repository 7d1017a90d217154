"""Folding an MoE step by identity (`traces.identity.partition_for`) against the unfolded run:
skewed routing folds its EP ranks apart by their experts' token counts, balanced routing folds
as far as the expert grid allows, and every representative's ops start and end exactly as
unfolded (the slow-node proof of test_fold_identity, on expert loads)."""

from __future__ import annotations

import pytest

from sim.config import experiment_from_dict
from sim.simulate import predict
from traces.moe import expert_loads
from traces.plan import plan_size

MODEL = {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 256, "vocab": 4096,
         "ffn": "swiglu", "ffn_hidden": 1024, "experts": 8, "top_k": 2, "moe_ffn_hidden": 256,
         "shared_experts": 1, "dense_layers": 1, "bias": False}


def experiment(tp: int, pp: int, dp: int, ep: int, *, etp: int = 1, cp: int = 1,
               per_node: int = 8, zero: int = 0, **model):
    world = tp * cp * pp * dp
    per_node = min(per_node, world)
    return experiment_from_dict({
        "model": {**MODEL, **model},
        "parallel": {"tp": tp, "sp": tp > 1, "pp": pp, "dp": dp, "cp": cp, "ep": ep,
                     "etp": etp, "zero": zero, "global_batch": 2 * dp * pp},
        "cluster": {"preset": "dgx-h100", "nodes": world // per_node,
                    "gpus_per_node": per_node, "fabric": "rail"}})


def assert_folded_equals_unfolded(exp, speeds=None):
    """The folded run's every representative op by op, and the step, as unfolded; the plan
    (and so the op cap) holds the representatives' ops only. The representatives' ranks."""
    folded, reps = predict(exp, fold=True, speeds=speeds)
    unfolded, every = predict(exp, fold=False, speeds=speeds)
    assert folded.step_time_s == unfolded.step_time_s
    for r in reps.plan.ops:
        assert reps.starts[r] == every.starts[r], r
        assert reps.ends[r] == every.ends[r], r
    assert reps.plan.num_ops() == sum(len(every.plan.ops[r]) for r in reps.plan.ops)
    assert folded.peak_memory_bytes == unfolded.peak_memory_bytes
    for name in ("compute_s", "exposed_comm_s", "bubble_fraction"):  # class-weighted means
        assert getattr(folded, name) == pytest.approx(getattr(unfolded, name), rel=1e-9,
                                                      abs=1e-15), name
    return sorted(reps.plan.ops)


# (tp, pp, dp, ep, etp, cp, GPUs per node), and the representatives skewed, balanced
CASES = [
    ((1, 1, 4, 2, 1, 1, 4), [0, 1], [0]),            # EP groups [0,1] [2,3]: not dp shifts
    ((1, 1, 16, 4, 1, 1, 8), [0, 1, 2, 3], [0]),     # 16 ranks, 2 nodes, EP 4 x expert-DP 4
    ((1, 1, 8, 4, 1, 1, 4), [0, 1, 2, 3], [0]),      # EP 4 on nodes of 4
    ((2, 1, 4, 4, 1, 1, 8), [0, 1, 2, 3], [0]),      # EP 4 over two TP pairs
    ((2, 2, 4, 4, 1, 1, 8), [0, 1, 2, 3, 8, 9, 10, 11], [0, 8]),  # with PP 2
    ((1, 2, 8, 4, 1, 1, 4), [0, 1, 2, 3, 8, 9, 10, 11], [0, 8]),  # PP 2 across nodes of 4
    ((2, 2, 8, 4, 1, 1, 8), [0, 1, 2, 3, 16, 17, 18, 19], [0, 16]),  # 32 ranks, 4 nodes
    ((1, 4, 8, 2, 1, 1, 8), [0, 1, 8, 9, 16, 17, 24, 25], [0, 8, 16, 24]),  # 32 ranks, PP 4
    ((2, 1, 4, 2, 2, 1, 8), [0, 2], [0]),            # ETP 2: EP pairs [0,2] [1,3] ...
    ((1, 1, 4, 2, 1, 2, 8), [0, 1], [0]),            # CP 2: the EP pair is the CP pair,
]                                                    # balanced: folded over CP (cp_fold)


@pytest.mark.parametrize(("shape", "skewed", "balanced"), CASES)
def test_a_skewed_moe_folded_by_expert_loads_equals_the_unfolded_run(shape, skewed,
                                                                     balanced):
    tp, pp, dp, ep, etp, cp, per_node = shape
    exp = experiment(tp, pp, dp, ep, etp=etp, cp=cp, per_node=per_node, routing_skew=1.0)
    assert assert_folded_equals_unfolded(exp) == skewed


@pytest.mark.parametrize(("shape", "skewed", "balanced"), CASES)
def test_a_balanced_moe_folded_equals_the_unfolded_run(shape, skewed, balanced):
    """Balanced routing keeps the fold of one rank per (cp, pp), also where the expert grid
    is not mapped onto itself by the shifts (EP 2 at TP 1: its copies match by class)."""
    tp, pp, dp, ep, etp, cp, per_node = shape
    exp = experiment(tp, pp, dp, ep, etp=etp, cp=cp, per_node=per_node)
    assert assert_folded_equals_unfolded(exp) == balanced
    if cp == 1:
        assert balanced == exp.layout.representatives()


def test_ep_ranks_whose_experts_get_equal_tokens_fold_together():
    """4 experts, top-2, one per EP rank, skew 1: shares 48/24/16/12 %; a capacity of half
    the balanced share caps the three busiest alike (⌈0.5·2T/4⌉ = 64 of T = 256 tokens), so
    in the one MoE layer three EP ranks (and their expert-DP replicas) fold together and the
    fourth apart."""
    exp = experiment(1, 1, 8, 4, per_node=4, experts=4, capacity_factor=0.5, routing_skew=1.0,
                     layers=2, dense_layers=1)
    loads = [expert_loads(exp.model, exp.layout, r) for r in range(8)]
    assert sorted(n for (n,), in loads[:4]) == [4 * 61, 4 * 64, 4 * 64, 4 * 64]
    assert loads[4:] == loads[:4]  # the expert-DP replica of each EP rank
    light = loads.index(((4 * 61,),))
    assert assert_folded_equals_unfolded(exp) == sorted({0 if light else 1, light})


def test_pipeline_neighbours_loads_set_a_stage_apart_too():
    """The same routing on two stages: stage 0's three capped EP ranks wait for stage 1
    ranks whose loads (layers 2, 3) differ, so they fold apart as the refinement says."""
    exp = experiment(1, 2, 8, 4, per_node=4, experts=4, capacity_factor=0.5, routing_skew=1.0,
                     layers=4, dense_layers=1)
    reps = assert_folded_equals_unfolded(exp)
    assert len([r for r in reps if r < 8]) == 3 and len(reps) < exp.layout.world


def test_every_ep_rank_folds_alike_when_capacity_evens_the_loads():
    """A capacity under every expert's skewed share caps them all: the loads are equal again
    and the skewed step folds as a balanced one, one rank per stage."""
    exp = experiment(2, 2, 4, 4, experts=8, capacity_factor=0.25, routing_skew=1.0)
    assert len({expert_loads(exp.model, exp.layout, r) for r in range(exp.layout.world)}) == 2
    assert assert_folded_equals_unfolded(exp) == [0, 8]


def test_a_slow_node_and_skewed_experts_fold_by_both():
    """16 ranks on 2 nodes, EP 4, node 1 slow: classes by speed and by EP load at once."""
    exp = experiment(1, 1, 16, 4, routing_skew=1.0)
    speeds = {r: 1.5 if r >= 8 else 1.0 for r in range(16)}
    reps = assert_folded_equals_unfolded(exp, speeds)
    assert reps == [0, 1, 2, 3, 8, 9, 10, 11]


def test_the_op_cap_counts_every_ranks_own_expert_gemms():
    """Under skew an EP rank runs one grouped GEMM per distinct token count of its experts:
    with capacity 0.5 some rank's two experts are both capped (one GEMM, not two), so ranks
    of one stage differ in op count; the plan's size counts each rank's own, folded or not."""
    exp = experiment(2, 2, 4, 4, routing_skew=1.0, capacity_factor=0.5)
    _, every = predict(exp, fold=False)
    stage0 = {len(every.plan.ops[r]) for r in range(8)}
    assert len(stage0) == 2  # 378 and 362 ops
    assert plan_size(exp.model, exp.layout) == every.plan.num_ops()
    _, reps = predict(exp, fold=True)
    assert plan_size(exp.model, exp.layout, reps.plan.ops) == reps.plan.num_ops()
