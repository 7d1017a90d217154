"""The MoE layer's kernels as they run (`traces.moe_steps`): counts and bytes per MoE layer in
closed form for each of Megatron-Core's kernel keys, and the per-expert GEMM's efficiency."""

from __future__ import annotations

import dataclasses

import pytest

from sim.models.compute import ComputeModel
from sim.profile import default_profile
from topology.presets import H100_SXM
from traces.errors import ConfigError
from traces.header_json import meta_from_json, meta_to_json
from traces.io import VERSION
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe import ExpertShard, moe_layer_kernels, routed_kernels
from traces.moe_steps import (
    capacity_steps,
    chunk_sort_rows,
    chunk_sort_steps,
    expert_capacity,
    moe_launch_counts,
    permute_steps,
    router_steps,
    unpermute_steps,
)
from traces.plan import build
from traces.purpose import Kernel, KernelRun
from traces.stack import launch_counts

K = Kernel
MOE = ModelSpec(layers=2, hidden=256, heads=4, seq_len=128, vocab=1000, ffn="swiglu",
                ffn_hidden=512, experts=8, top_k=2, moe_ffn_hidden=128, dense_layers=1,
                bias=False, norm="rmsnorm", position="rope")
T, E, k, h, e = 128, 8, 2, 256, 2
A = T * k  # balanced and dropless: every assignment kept


def _with(**fields: object) -> ModelSpec:
    return dataclasses.replace(MOE, **fields)


def _routed(model: ModelSpec, ep: int = 8) -> list:
    """The routed kernels of EP rank 0 (by default EP 8: one local expert each, so no sort of
    the received rows, `chunk_sort_rows`)."""
    return routed_kernels(model, 1, T, ExpertShard(ep=ep), e)


def test_fused_defaults_keep_one_kernel_each_with_the_fused_bytes():
    by_name = {w.name: w for w in _routed(MOE)}
    assert [w.name for w in _routed(MOE)] == [K.ROUTER, K.TOPK, K.AUX_LOSS, K.PERMUTE,
                                              K.EXPERT_FC1, K.EXPERT_ACT, K.EXPERT_FC2,
                                              K.UNPERMUTE]
    assert all(w.launches is None for w in by_name.values())
    # fused permute: each token read once, written once per expert it goes to
    assert by_name[K.PERMUTE].mem_bytes == T * h * e + T * E + T * k * h * e
    assert by_name[K.UNPERMUTE].mem_bytes == A * (h * e + 4) + T * h * e
    assert moe_launch_counts(MOE) == {} and launch_counts(MOE) is None


def test_unfused_permutation_moves_tokens_times_top_k_times_hidden_twice():
    """index_select reads the A = T·k rows it gathers and writes them: 2·T·k·h·e, plus its
    int64 indices; scatter_add (unpermute) reads them and adds them into T rows."""
    model = _with(moe_permute_fusion=False)
    fwd, bwd = permute_steps(model, T, A)
    assert dict(fwd)["index_select"] == 2 * T * k * h * e + A * 8
    assert [s for s, _ in fwd] == ["transpose", "masked_select", "index_select"]
    assert sum(b for _, b in bwd) == T * h * e + A * 8 + 3 * T * k * h * e
    ufwd, _ = unpermute_steps(model, T, A)
    assert dict(ufwd)["scatter_add"] == A * 8 + 3 * T * k * h * e
    assert dict(ufwd)["mul"] == 2 * T * k * h * e + A * e
    by_name = {w.name: w for w in _routed(model)}
    assert by_name[K.PERMUTE].launches == (3, 2)
    assert by_name[K.UNPERMUTE].launches == (5, 6)
    assert by_name[K.PERMUTE].mem_bytes == 2 * T * E + T * E + A * 8 + A * 8 + 2 * A * h * e


@pytest.mark.parametrize(("fields", "fwd", "bwd"), [
    ({}, 1, 1),
    ({"moe_router_fusion": False}, 7, 6),
    ({"moe_router_fusion": False, "moe_router_score_function": "sigmoid"}, 9, 8),
    ({"moe_router_fusion": False, "moe_router_score_function": "sigmoid",
      "moe_router_enable_expert_bias": True}, 11, 8),
])
def test_router_kernels_per_moe_layer(fields, fwd, bwd):
    """Unfused softmax: topk, softmax of the k, routing_probs and routing_map (zeros and
    scatter each), the aux loss's scores = 7; sigmoid adds its sigmoid, sum and div (9), and
    the expert bias its add and the gather of the unbiased scores (11)."""
    steps = router_steps(_with(**fields), T)
    assert (len(steps[0]), len(steps[1])) == (fwd, bwd)


def test_token_drop_adds_megatrons_capacity_ops_to_the_unfused_router():
    """capacity_factor 1 (T = 128 tokens, k = 2 of E = 8): C = ⌈128·2/8⌉ = 32 slots an
    expert; topk over the tokens reads T·E probabilities and writes E·C values and int64
    indices, the scatter writes E·C ones; logical_and reads two T×E masks and writes one, mul
    reads probabilities and mask and writes probabilities, and its backward the same. Six more
    kernels forward, one backward; the fused router and a dropless one are unchanged."""
    drop = _with(moe_router_fusion=False, capacity_factor=1.0)
    assert expert_capacity(drop, T) == 32 and expert_capacity(_with(capacity_factor=8.0), T) == T
    fwd, bwd = capacity_steps(drop, T)
    slots = E * 32
    assert fwd == [("capacity_topk", T * E * e + slots * (e + 8)), ("capacity_zeros", T * E * e),
                   ("capacity_scatter", slots * (8 + e)), ("capacity_bool", T * E * e + T * E),
                   ("logical_and", 3 * T * E), ("mul", 2 * T * E * e + T * E)]
    assert bwd == [("mul_bwd", 2 * T * E * e + T * E)]
    steps = router_steps(drop, T)
    dropless = router_steps(_with(moe_router_fusion=False), T)
    assert (len(steps[0]), len(steps[1])) == (len(dropless[0]) + 6, len(dropless[1]) + 1)
    assert router_steps(_with(capacity_factor=1.0), T) == router_steps(MOE, T)
    assert capacity_steps(_with(moe_router_fusion=False), T) == ([], [])


def test_expert_bias_and_sigmoid_fused_bytes():
    fused = router_steps(_with(moe_router_score_function="sigmoid",
                               moe_router_enable_expert_bias=True), T)
    assert fused[0] == [("fused_topk", T * E * e + T * E * 4 + T * k * 8 + E * 4)]
    unfused = dict(router_steps(_with(moe_router_fusion=False,
                                      moe_router_score_function="sigmoid",
                                      moe_router_enable_expert_bias=True), T)[0])
    assert unfused["sigmoid"] == 2 * T * E * e and unfused["add"] == 2 * T * E * e + E * 4
    assert unfused["topk"] == T * E * e + T * k * (e + 8)


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_grouped_gemm_is_one_op_and_sequential_one_per_local_expert(ep):
    n = E // ep
    grouped = [w for w in _routed(MOE, ep) if w.name is K.EXPERT_FC1]
    sequential = [w for w in _routed(_with(moe_grouped_gemm=False), ep)
                  if w.name is K.EXPERT_FC1]
    m = ep * T * k // E  # tokens each local expert gets from the ep ranks
    assert [w.gemm for w in grouped] == [(n, m, 2 * 128, h)]
    assert [w.gemm for w in sequential] == [(1, m, 2 * 128, h)] * n
    assert sum(w.flops for w in sequential) == grouped[0].flops
    layer = moe_layer_kernels(_with(moe_grouped_gemm=False), 1, 1, False, 1, ExpertShard(ep=ep))
    assert len(layer) == len(moe_layer_kernels(MOE, 1, 1, False, 1, ExpertShard(ep=ep))) \
        + 2 * (n - 1)


def _efficiency(compute: ComputeModel, m: int, experts: int = 4, n: int = 4096,
                kk: int = 7168) -> float:
    flops = 2.0 * experts * m * n * kk
    nbytes = experts * (m * kk + kk * n + m * n) * 2
    seconds = compute.kernel_time("expert_fc1", flops, nbytes, (experts, m, n, kk))
    return flops / seconds / H100_SXM.sustained_flops


def test_per_expert_gemm_efficiency_rises_with_its_tokens():
    """Tokens per expert M in powers of two: the weights' N·K bytes are read whatever M is
    and an M below the tile height pays a whole tile, so small M runs far below peak."""
    compute = ComputeModel(H100_SXM, default_profile(H100_SXM))
    effs = [_efficiency(compute, 2 ** i) for i in range(0, 15)]
    assert effs == sorted(effs)
    assert effs[4] < 0.1 * effs[-1]  # M = 16: memory-bound on its weights
    # below the ridge the weights' read sets the time: N·K·e per expert at the HBM rate
    weights = 4 * 4096 * 7168 * 2 / (H100_SXM.sustained_hbm_Bps * 0.8)
    assert 2.0 * 4 * 4096 * 7168 / (effs[0] * H100_SXM.sustained_flops) > weights


def test_sequential_experts_cost_their_launches_and_their_own_waves():
    compute = ComputeModel(H100_SXM, default_profile(H100_SXM))
    grouped = [w for w in _routed(MOE, 1) if w.name is K.EXPERT_FC2][0]
    sequential = [w for w in _routed(_with(moe_grouped_gemm=False), 1)
                  if w.name is K.EXPERT_FC2]

    def t(w) -> float:
        return compute.kernel_time(str(w.name), w.flops, w.mem_bytes, w.gemm)
    overhead = default_profile(H100_SXM).compute.launch_overhead_s
    assert sum(map(t, sequential)) >= t(grouped) + (len(sequential) - 1) * overhead


def test_plan_and_compute_model_charge_the_unfused_launches():
    model = _with(moe_router_fusion=False, moe_permute_fusion=False)
    counts = launch_counts(model)
    assert counts == {("topk", False): 7, ("topk", True): 6, ("permute", False): 3,
                      ("permute", True): 2, ("unpermute", False): 5, ("unpermute", True): 6}
    plan = build(model, Layout(ep=2, dp=2, micro_batch=1, global_batch=2))
    profile = default_profile(H100_SXM)
    compute = ComputeModel(H100_SXM, profile, counts)
    op = next(op for op in plan.ops[0] if isinstance(op.purpose, KernelRun)
              and op.purpose.kernel is K.TOPK)
    memory = op.mem_bytes / (H100_SXM.sustained_hbm_Bps * profile.compute.memory_efficiency)
    assert compute.duration(op) == pytest.approx(memory + 7 * profile.compute.launch_overhead_s)


@pytest.mark.parametrize(("fields", "needle"), [
    ({"moe_grouped_gemm": 1}, "model.moe_grouped_gemm: 1 must be true or false"),
    ({"moe_router_score_function": "relu"}, "is not one of softmax, sigmoid"),
    ({"experts": 0, "top_k": 0, "moe_ffn_hidden": 0, "dense_layers": 0,
      "moe_permute_fusion": False}, "needs model.experts > 0"),
    ({"experts": 0, "top_k": 0, "moe_ffn_hidden": 0, "dense_layers": 0,
      "moe_router_score_function": "sigmoid"}, "needs model.experts > 0"),
])
def test_bad_kernel_keys_are_refused(fields, needle):
    with pytest.raises(ConfigError, match=needle):
        _with(**fields)


def test_header_writes_the_keys_only_where_set_and_reads_them_back():
    plan = build(_with(moe_router_score_function="sigmoid", moe_permute_fusion=False),
                 Layout(micro_batch=1, global_batch=1))
    written = meta_to_json(plan.meta)
    assert written["model"]["moe_router_score_function"] == "sigmoid"
    assert "moe_router_fusion" not in written["model"]
    assert meta_from_json(written, VERSION).model == plan.meta.model


def test_several_local_experts_sort_the_received_rows_into_expert_order_and_back():
    """Megatron-Core's all-to-all dispatcher re-sorts the R rows a rank receives from (source
    rank, expert) into expert order when it holds more than one expert, and back before the
    combine: one read and one write of every row each way, on the permute's and unpermute's
    ops; none with one local expert or a DeepEP dispatch."""
    one = {w.name: w for w in _routed(MOE, 8)}
    four = {w.name: w for w in _routed(MOE, 2)}
    R = 2 * A // 2  # EP 2: each of the 4 local experts gets T·k/E tokens from 2 ranks
    assert chunk_sort_rows(MOE, (64, 64, 64, 64)) == R
    assert chunk_sort_rows(MOE, (256,)) == 0
    assert chunk_sort_rows(_with(dispatch="deepep"), (64, 64, 64, 64)) == 0
    copy = 2 * R * h * e
    assert four[K.PERMUTE].mem_bytes - one[K.PERMUTE].mem_bytes == copy
    assert four[K.PERMUTE].bwd_bytes - one[K.PERMUTE].bwd_bytes == copy
    assert four[K.UNPERMUTE].mem_bytes - one[K.UNPERMUTE].mem_bytes == copy
    assert four[K.UNPERMUTE].bwd_bytes - one[K.UNPERMUTE].bwd_bytes == copy
    assert four[K.PERMUTE].launches == (2, 2) and one[K.PERMUTE].launches is None
    # the experts weigh by the probabilities: the dispatch's sort carries R fp32 of them
    weighed = _with(moe_probs_in_activation=True)
    assert chunk_sort_steps(weighed, R, True) == ([("sort_chunks_by_index", copy + 8 * R)],
                                                  [("sort_chunks_by_index_bwd", copy + 8 * R)])
    assert chunk_sort_steps(weighed, R, False)[0] == [("unsort_chunks_by_index", copy)]
    assert chunk_sort_steps(MOE, 0, True) == ([], [])
