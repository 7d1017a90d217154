"""MoE steps simulated: folded equals unfolded, skewed routing costs what the busiest EP rank's
extra tokens cost, expert memory equals a hand count sharded by EP."""

from __future__ import annotations

import copy

import pytest

from sim.collectives import Collectives
from sim.collectives.nccl_p2p import peer_plan
from sim.config import experiment_from_dict
from sim.models.compute import ComputeModel
from sim.models.memory import memory_by_pp_rank
from sim.simulate import predict
from traces.moe_spec import expert_counts, expert_params
from traces.ops import OpKind
from traces.purpose import ExpertAllToAll, Kernel, KernelRun, MoeStep

CONFIG = {
    "model": {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 256, "vocab": 4096,
              "ffn": "swiglu", "ffn_hidden": 1024, "experts": 8, "top_k": 2,
              "moe_ffn_hidden": 256, "shared_experts": 1, "dense_layers": 1, "bias": False},
    "parallel": {"tp": 2, "sp": True, "pp": 2, "dp": 2, "ep": 2, "global_batch": 8},
    "cluster": {"preset": "dgx-h100", "nodes": 1},
}
EXPERT_KERNELS = {Kernel.EXPERT_FC1, Kernel.EXPERT_ACT, Kernel.EXPERT_FC2}
RECEIVED_ROW_KERNELS = EXPERT_KERNELS | {Kernel.PERMUTE, Kernel.UNPERMUTE}
"""The kernels whose work follows the rows a rank receives: the experts', and the permute's
and unpermute's, which carry the dispatcher's sort of the received rows (`traces.moe`)."""


def _config(**edits):
    out = copy.deepcopy(CONFIG)
    for table, values in edits.items():
        out[table].update(values)
    return out


@pytest.mark.parametrize("edits", [
    {},
    {"parallel": {"zero": 1, "ep": 4, "recompute": "full"}},
    {"parallel": {"ep": 2, "etp": 2, "dp": 2}},
])
def test_folded_equals_unfolded_on_balanced_moe(edits):
    exp = experiment_from_dict(_config(**edits))
    folded, _ = predict(exp, fold=True)
    unfolded, _ = predict(exp, fold=False)
    assert folded.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-9)
    assert folded.peak_memory_bytes == unfolded.peak_memory_bytes


def test_a_skewed_moe_folds_its_ep_ranks_apart_so_folding_hides_nothing():
    exp = experiment_from_dict(_config(model={"routing_skew": 1.0}))
    folded, times = predict(exp, fold=True)
    unfolded, every = predict(exp, fold=False)
    assert folded.step_time_s == unfolded.step_time_s
    # per stage, one rank per EP coordinate (EP 2 is the TP pair here): their loads differ
    assert sorted(times.plan.ranks) == [0, 1, 4, 5]
    for r in times.plan.ranks:
        assert times.starts[r] == every.starts[r] and times.ends[r] == every.ends[r]


def _expert_seconds(exp, times, kernels=EXPERT_KERNELS) -> dict[int, float]:
    """Each rank's `kernels` (forward and backward), costed by the compute model."""
    compute = ComputeModel(exp.cluster.accelerator, exp.profile)
    return {r: sum(compute.duration(op) for op in ops if isinstance(op.purpose, KernelRun)
                   and op.purpose.kernel in kernels)
            for r, ops in times.plan.ops.items()}


def test_a_skewed_step_is_longer_by_the_busiest_ranks_extra_expert_time():
    """One MoE layer, one micro-batch, EP 2 over two NVLink GPUs (nothing contends): the
    combine waits for the busiest EP rank, so the step grows by exactly its extra time over
    the balanced rank's in the kernels that follow the rows it receives (the experts', and
    the dispatcher's sort of those rows, charged on the permute and unpermute), forward and
    backward, plus what the uneven all-to-alls cost over even ones.

    Each of the 4 all-to-alls (dispatch and combine, forward and backward) sends one message
    each way, rank 0 -> 1 and 1 -> 0, each alone on its NVLink direction, carrying the two
    per-peer sizes s_0, s_1 of the split (a transpose has the same two): it ends when the
    slower has moved, max_k t(s_k), with t(v) = NCCL's latency for a message of v (its
    protocol, channels and steps: `peer_plan`) + wire bytes / the link rate; even, both carry
    A/2 (A = s_0 + s_1, the rank's buffer), t(A/2). Every rank waits for each, so the step
    grows by the experts' extra plus 4 (max_k t(s_k) - t(A/2))."""
    small = {"model": {"layers": 2, "dense_layers": 1, "shared_experts": 0},
             "parallel": {"tp": 1, "sp": False, "pp": 1, "dp": 2, "ep": 2, "global_batch": 2},
             "cluster": {"gpus_per_node": 2}}
    balanced = experiment_from_dict(_config(**small))
    skewed = experiment_from_dict(_config(**{**small, "model": {**small["model"],
                                                                "routing_skew": 1.5}}))
    b_summary, b_times = predict(balanced, fold=False)
    s_summary, s_times = predict(skewed, fold=False)
    b_cost = _expert_seconds(balanced, b_times, RECEIVED_ROW_KERNELS)
    s_cost = _expert_seconds(skewed, s_times, RECEIVED_ROW_KERNELS)
    assert len(set(b_cost.values())) == 1 and len(set(s_cost.values())) == 2
    extra = max(s_cost.values()) - b_cost[0]
    assert extra > 0
    cluster = skewed.cluster
    sys = Collectives(cluster).nccl_system((0, 1))
    assert sys is not None
    rate = min(cluster.link_capacity[link] for link in cluster.route(0, 1))

    def seconds(v: float) -> float:
        plan = peer_plan(sys, v)
        return plan.latency_s + plan.wire_factor * v / rate

    a2a = [op for op in s_times.plan.ops[0] if op.kind is OpKind.ALL_TO_ALL]
    assert len(a2a) == 4 and all(op.split is not None for op in a2a)
    split = a2a[0].split
    assert split is not None and len(set(split.sizes)) == 2
    uneven = max(seconds(v) for v in split.sizes) - seconds(split.mean_send_bytes / 2)
    assert uneven > 0
    assert s_summary.step_time_s - b_summary.step_time_s == \
        pytest.approx(extra + 4 * uneven, rel=1e-6)


def test_the_skewed_all_to_all_matrix_is_the_routed_tokens_times_the_hidden_size():
    """Dispatch: EP rank i sends EP rank j the tokens its experts get of i's T tokens, times
    h x 2 bytes (bf16); the combine (and the dispatch's gradients) the transpose. The
    counts come from the routing itself (`expert_counts`), summed per EP rank's experts."""
    exp = experiment_from_dict(_config(model={"routing_skew": 1.2},
                                       parallel={"tp": 1, "sp": False, "dp": 4, "ep": 4}))
    _, times = predict(exp, fold=False)
    m = exp.model
    tokens = 1 * m.seq_len  # micro-batch 1, no TP: T = b·s
    for rank, ops in times.plan.ops.items():
        for op in ops:
            if op.kind is not OpKind.ALL_TO_ALL:
                continue
            assert op.layer is not None and isinstance(op.purpose, ExpertAllToAll)
            counts = expert_counts(m, op.layer, tokens)
            per_rank = [sum(counts[2 * j:2 * j + 2]) for j in range(4)]  # 8 experts / EP 4
            dispatch = [[per_rank[j] * m.hidden * 2 for j in range(4)] for _ in range(4)]
            reverse = (op.purpose.step is MoeStep.COMBINE) != op.purpose.grad
            want = [list(r) for r in zip(*dispatch)] if reverse else dispatch
            assert op.split is not None and op.split.matrix() == want
            assert op.size_bytes == sum(map(sum, want)) / 4 == sum(counts) * m.hidden * 2
            me = op.group.index(rank)
            assert list(op.split.send_splits(me)) == want[me]
            assert list(op.split.recv_splits(me)) == [row[me] for row in want]


def test_the_all_to_alls_carry_each_ranks_routed_tokens():
    exp = experiment_from_dict(_config(parallel={"tp": 1, "sp": False, "dp": 4, "ep": 4}))
    _, times = predict(exp, fold=False)
    a2a = [op for op in times.plan.ops[0] if op.kind is OpKind.ALL_TO_ALL]
    # 3 MoE layers on 2 stages: rank 0 (stage 0) holds layers 0, 1, of which layer 1 is MoE;
    # per micro-batch dispatch and combine, forward and backward; 256 tokens · k 2 · h · 2 bytes
    assert len(a2a) == 1 * 4 * 2
    assert {op.size_bytes for op in a2a} == {256 * 2 * 512 * 2}
    assert {op.group for op in a2a} == {(0, 1, 2, 3)}


def test_expert_memory_equals_a_hand_count_sharded_by_ep():
    exp = experiment_from_dict(_config(parallel={"tp": 1, "sp": False, "dp": 4, "ep": 4,
                                                 "pp": 1}, cluster={"gpus_per_node": 4}))
    m = exp.model
    h, f = 512, 256
    attn = 4 * h * h
    norms = 2 * 2 * h  # two LayerNorms, weight and bias
    expert = expert_params(m)
    assert expert == 3 * h * f
    dense_layer = attn + 3 * h * 1024 + norms
    moe_layer_rank = attn + norms + h * 8 + 1 * expert + 8 / 4 * expert
    # tied embeddings with learned positions (s·h), the final LayerNorm
    params = dense_layer + 3 * moe_layer_rank + 4096 * h + 256 * h + 2 * h
    memory = memory_by_pp_rank(m, exp.layout)[0]
    assert memory.params_bytes == 2 * params
    # ZeRO 0: gradients as the parameters, Adam's 12 bytes on every one
    assert memory.optimizer_bytes == 12 * params
