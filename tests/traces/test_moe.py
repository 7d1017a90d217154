"""Mixture of experts: routing counts, kernels' FLOPs and bytes against hand formulas, the
parameter count sharded by EP, model FLOPs two ways, the expert grid's groups."""

from __future__ import annotations

import math

import pytest

from traces.errors import ConfigError
from traces.expert_grid import ep_group, etp_group, expert_data_group
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.moe import (
    ExpertShard,
    dispatch_matrix,
    local_expert_tokens,
    moe_layer_kernels,
    rank_tokens,
)
from traces.moe_spec import expert_counts, expert_popularity
from traces.purpose import Kernel
from traces.step_flops import megatron_num_flops, model_flops

K = Kernel
MOE = ModelSpec(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000, ffn="swiglu",
                ffn_hidden=512, experts=8, top_k=2, moe_ffn_hidden=128, shared_experts=1,
                dense_layers=1, bias=False, norm="rmsnorm", position="rope")
SKEW = ModelSpec(**{**{f: getattr(MOE, f) for f in MOE.__dataclass_fields__},
                    "routing_skew": 1.2})


def test_balanced_routing_gives_every_expert_its_share():
    assert expert_counts(MOE, 1, 128) == (128 * 2 // 8,) * 8


def test_skewed_routing_is_a_deterministic_zipf_law_per_layer():
    shares = expert_popularity(SKEW, 1)
    ranked = sorted(shares, reverse=True)
    harmonic = sum(1 / (i + 1) ** 1.2 for i in range(8))
    assert ranked == pytest.approx([1 / (i + 1) ** 1.2 / harmonic for i in range(8)])
    assert expert_popularity(SKEW, 2) != shares  # each layer its own permutation
    counts = expert_counts(SKEW, 1, 128)
    assert sum(counts) == 128 * 2 and max(counts) <= 128
    assert counts == expert_counts(SKEW, 1, 128)


def test_no_expert_gets_more_tokens_than_there_are_and_capacity_drops_the_rest():
    heavy = ModelSpec(**{**{f: getattr(MOE, f) for f in MOE.__dataclass_fields__},
                         "routing_skew": 8.0})
    counts = expert_counts(heavy, 1, 100)
    assert max(counts) == 100 and sum(counts) == 200
    capped = ModelSpec(**{**{f: getattr(heavy, f) for f in MOE.__dataclass_fields__},
                          "capacity_factor": 1.5})
    cap = math.ceil(1.5 * 100 * 2 / 8)  # 38
    assert expert_counts(capped, 1, 100) == tuple(min(c, cap) for c in counts)


def _kernels(model, shard, t=1, sp=False, layer=1):
    return {k.name: k for k in moe_layer_kernels(model, 1, t, sp, layer, shard)}, \
        [k for k in moe_layer_kernels(model, 1, t, sp, layer, shard)]


def test_router_permutation_and_grouped_gemms_equal_hand_formulas():
    shard = ExpertShard(ep=2, ep_rank=1)
    by_name, kernels = _kernels(SKEW, shard)
    T, E, k, h, e, f = 128, 8, 2, 256, 2, 128
    counts = expert_counts(SKEW, 1, T)
    A = sum(counts)
    assert by_name[K.ROUTER].flops == 2 * T * E * h
    assert by_name[K.ROUTER].gemm == (1, T, E, h)
    assert by_name[K.TOPK].mem_bytes == T * E * e + T * E * 4 + T * k * 8
    local = [2 * c for c in counts[4:]]  # EP rank 1 holds experts 4..7, from 2 EP ranks
    R = sum(local)  # 4 local experts: the received rows sorted into expert order and back
    assert by_name[K.PERMUTE].mem_bytes == T * h * e + T * E + A * h * e + 2 * R * h * e
    assert by_name[K.PERMUTE].bwd_bytes == (A + T) * h * e + 2 * R * h * e
    assert by_name[K.UNPERMUTE].mem_bytes == A * (h * e + 4) + T * h * e + 2 * R * h * e
    assert local_expert_tokens(SKEW, 1, T, shard) == tuple(local)
    fc1 = [x for x in kernels if x.name is K.EXPERT_FC1]
    fc2 = [x for x in kernels if x.name is K.EXPERT_FC2]
    assert sum(x.flops for x in fc1) == sum(2 * m * 2 * f * h for m in local)
    assert sum(x.flops for x in fc2) == sum(2 * m * f * h for m in local)
    assert sorted(x.gemm[1] for x in fc1 for _ in range(x.gemm[0])) == sorted(local)
    assert by_name[K.EXPERT_ACT].mem_bytes == 3 * sum(local) * f * e
    # the shared expert is the dense MLP of width S·f: fc1 (1, T, 2f, h), fc2 (1, T, h, f)
    assert by_name[K.FC1].gemm == (1, T, 2 * f, h) and by_name[K.FC2].gemm == (1, T, h, f)


def test_balanced_grouped_gemm_is_one_op_over_the_local_experts():
    _, kernels = _kernels(MOE, ExpertShard(ep=4, etp=2, ep_rank=0), t=1)
    fc1 = [x for x in kernels if x.name is K.EXPERT_FC1]
    # 8/4 experts, each 4·2·32 = 256 tokens (EP 4 x ETP 2 ranks of 32 each), fc1 2f/etp wide
    assert [x.gemm for x in fc1] == [(2, 4 * 2 * 32, 2 * 128 // 2, 256)]


@pytest.mark.parametrize(("recipe", "per_element"), [("mxfp8", 2 + 2 * (1 + 1 / 32)),
                                                     ("tensorwise", 2 + 2 + 2)])
def test_fp8_experts_quantize_their_inputs_and_output_gradients(recipe, per_element):
    """FP8 experts: before each grouped GEMM its R·K input is quantized (bf16 read, rowwise and
    columnwise FP8 copies with their scales written; current scaling reads it once more for
    its amax), and before the GEMM's backward its R·N output gradient likewise; none in bf16."""
    fp8 = ModelSpec(**{**{f: getattr(MOE, f) for f in MOE.__dataclass_fields__},
                       "dtype": "fp8", "fp8_recipe": recipe})
    shard = ExpertShard(ep=2, ep_rank=0)
    kernels = moe_layer_kernels(fp8, 1, 1, False, 1, shard)
    R, h, f = sum(local_expert_tokens(fp8, 1, 128, shard)), 256, 128
    names = [k.name for k in kernels]
    at = names.index(K.EXPERT_FC1)
    assert names[at - 1:at + 2] == [K.EXPERT_CAST, K.EXPERT_FC1, K.EXPERT_CAST_GRAD]
    at = names.index(K.EXPERT_FC2)
    assert names[at - 1:at + 2] == [K.EXPERT_CAST, K.EXPERT_FC2, K.EXPERT_CAST_GRAD]
    casts = [k for k in kernels if k.name is K.EXPERT_CAST]
    grads = [k for k in kernels if k.name is K.EXPERT_CAST_GRAD]
    assert [k.mem_bytes for k in casts] == pytest.approx(
        [per_element * R * h, per_element * R * f], rel=1e-12)
    assert [k.bwd_bytes for k in grads] == pytest.approx(
        [per_element * R * 2 * f, per_element * R * h], rel=1e-12)
    assert not any(k.bwd_bytes for k in casts) and not any(k.mem_bytes for k in grads)
    bf16 = [k.name for k in moe_layer_kernels(MOE, 1, 1, False, 1, shard)]
    assert K.EXPERT_CAST not in bf16 and K.EXPERT_CAST_GRAD not in bf16


def test_the_dense_layers_keep_their_mlp():
    names = [k.name for k in moe_layer_kernels(MOE, 1, 1, False, 0, ExpertShard())]
    assert K.ROUTER not in names and K.FC1 in names


def test_dispatch_matrix_is_routed_tokens_times_hidden_times_bytes():
    T = rank_tokens(SKEW, 1, 1)
    counts = expert_counts(SKEW, 1, T)
    matrix = dispatch_matrix(SKEW, 1, T, 4)
    for row in matrix:
        assert row == [(counts[2 * d] + counts[2 * d + 1]) * 256 * 2 for d in range(4)]


def test_parameters_equal_a_hand_count_sharded_by_ep():
    h, f, E, S = 256, 128, 8, 1
    expert = h * 2 * f + f * h  # SwiGLU: gate and up, down
    attn = h * (h + 2 * h) + h * h  # MHA, no biases
    norms = 2 * h  # two RMSNorms
    for tp, ep in ((1, 1), (2, 2), (1, 4)):
        moe = attn / tp + norms + h * E + S * expert / tp + E / ep * expert
        assert MOE.layer_params(tp, 1, ep) == moe
    dense = attn + h * 2 * 512 + 512 * h + norms
    embed = 1000 * h
    assert MOE.num_params() == dense + 3 * (attn + norms + h * E + (S + E) * expert) + \
        embed + h
    assert MOE.active_params() == MOE.num_params() - 3 * (E - 2) * expert


def test_model_flops_count_the_activated_experts_as_megatron_does():
    # Megatron-LM's MoE branch: dense layers at ffn_hidden, MoE at (top_k + shared)·moe_ffn
    assert model_flops(MOE, 8) == pytest.approx(megatron_num_flops(MOE, 8), rel=1e-12)
    b, s, h = 1, 128, 256
    assert MOE.mlp_flops(1, 1, 2) == 2 * b * s * h * 3 * (2 + 1) * 128
    assert MOE.mlp_flops(1, 1, 0) == 2 * b * s * h * 3 * 512


def test_expert_groups_fold_etp_fastest_then_ep_then_expert_dp():
    layout = Layout(tp=2, dp=8, pp=2, ep=4, etp=2, sp=True, global_batch=8)
    # a stage's 16 ranks: etp = i % 2, ep = (i // 2) % 4, edp = i // 8
    assert ep_group(layout, 0) == (0, 2, 4, 6)
    assert ep_group(layout, 16 + 9) == (16 + 9, 16 + 11, 16 + 13, 16 + 15)
    assert etp_group(layout, 5) == (4, 5)
    assert expert_data_group(layout, 3) == (3, 11)
    # ETP 1, TP 2: EP 8 is 8 consecutive ranks, over the TP pairs
    assert ep_group(Layout(tp=2, dp=8, ep=8, sp=True, global_batch=8), 9) == \
        tuple(range(8, 16))


@pytest.mark.parametrize(("fields", "needle"), [
    (dict(top_k=9), "model.top_k: 9 must be from 1 to model.experts = 8"),
    (dict(top_k=0), "model.top_k: 0 must be from 1"),
    (dict(routing_skew=-0.5), "model.routing_skew: -0.5 must be a number from 0"),
    (dict(routing_skew=float("nan")), "model.routing_skew: nan must be a number"),
    (dict(capacity_factor=float("inf")), "model.capacity_factor: inf must be a number"),
    (dict(dense_layers=4), "model.dense_layers: 4 must be fewer than model.layers = 4"),
    (dict(experts=-1), "model.experts: -1 must be an integer"),
    (dict(experts=0), "model.top_k: 2 needs model.experts > 0"),
])
def test_bad_moe_values_are_refused(fields, needle):
    values = {f: getattr(MOE, f) for f in MOE.__dataclass_fields__}
    with pytest.raises(ConfigError, match="^" + needle.replace("(", r"\(").replace(".", r"\.")):
        ModelSpec(**{**values, **fields, "moe_ffn_hidden": 128})


@pytest.mark.parametrize(("layout", "needle"), [
    (dict(dp=4, ep=3), "parallel.ep: etp 1 x ep 3 = 3 does not divide tp x cp x dp = 4"),
    (dict(dp=8, ep=16), "parallel.ep: etp 1 x ep 16 = 16 does not divide"),
    (dict(dp=4, ep=0), "parallel.ep: 0 must be an integer from 1"),
    (dict(dp=6, ep=6, global_batch=6), "parallel.ep: 6 does not divide model.experts = 8"),
    (dict(tp=2, dp=2, ep=2), "parallel.sp: an MoE model at tp 2 needs sp = true"),
    (dict(dp=4, ep=2, etp=2, moe=dict(moe_ffn_hidden=127)),
     "parallel.etp: 2 does not divide model.moe_ffn_hidden = 127"),
])
def test_bad_expert_layouts_are_refused(layout, needle):
    moe = layout.pop("moe", {})
    values = {f: getattr(MOE, f) for f in MOE.__dataclass_fields__}
    model = ModelSpec(**{**values, **moe})
    with pytest.raises(ConfigError) as error:
        check_layout(model, Layout(**{"global_batch": 8, **layout}))
    assert str(error.value).startswith(needle), error.value


def test_ep_without_experts_is_refused():
    dense = ModelSpec(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000)
    with pytest.raises(ConfigError, match=r"^parallel\.ep: ep 2, etp 1 need model\.experts"):
        check_layout(dense, Layout(dp=2, ep=2, global_batch=2))
