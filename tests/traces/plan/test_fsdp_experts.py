"""ZeRO 3 (FSDP) with expert parallelism (MoE Parallel Folding's FSDP+EP baselines): an MoE
layer's routed experts gathered over the expert-DP group before each use and their gradients
reduce-scattered over it, its dense parameters over DP; the bytes per group in closed form,
and the model states per rank (dense over DP, experts over expert-DP)."""

from __future__ import annotations

import pytest

from sim.models.memory import memory_by_pp_rank
from traces.expert_grid import expert_data_group
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase, Stream
from traces.plan import build
from traces.purpose import ExpertGrads, ExpertParamGather, ExpertUnitGather, UnitGather

MOE = ModelSpec(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000, ffn="swiglu",
                ffn_hidden=512, experts=8, top_k=2, moe_ffn_hidden=128, dense_layers=1,
                bias=False, norm="rmsnorm", position="rope")
EXPERT = 3 * 256 * 128  # one SwiGLU expert: gate, up and down, h x moe_ffn_hidden
MOE_LAYERS = 3  # layers 1-3 (dense_layers = 1)


def _layout(**kw: object) -> Layout:
    return Layout(**{"dp": 8, "ep": 2, "zero": 3, "micro_batch": 1, "global_batch": 16, **kw})


@pytest.mark.parametrize(("ep", "grad_bytes"), [(2, 2), (4, 4), (8, 2)])
def test_experts_gather_and_reduce_over_expert_dp_per_use_in_closed_form(
        ep: int, grad_bytes: int) -> None:
    """Per rank and step: m micro-batches x 3 MoE layers x (forward + backward) gathers of
    its E/ep experts over expert-DP (dp/ep ranks), 2 bytes a parameter, and one
    reduce-scatter per layer and micro-batch in the gradients' bytes; none after the step."""
    layout = _layout(ep=ep, fp32_main_grads=grad_bytes == 4)
    m = layout.num_microbatches
    assert m == 2
    local = MOE.experts // ep * EXPERT
    for rank, ops in build(MOE, layout).ops.items():
        edp = expert_data_group(layout, rank)
        assert len(edp) == 8 // ep
        gathers = [op for op in ops if isinstance(op.purpose, ExpertUnitGather)]
        reduces = [op for op in ops if isinstance(op.purpose, ExpertGrads)]
        if len(edp) == 1:  # EP over all of DP: nothing to shard the experts over
            assert not gathers and not reduces
            continue
        assert all(op.group == edp and op.kind is OpKind.ALL_GATHER
                   and op.stream is Stream.ZERO_AG for op in gathers)
        assert all(op.group == edp and op.kind is OpKind.REDUCE_SCATTER
                   and op.stream is Stream.ZERO_RS for op in reduces)
        assert sum(op.size_bytes for op in gathers) == 2 * m * MOE_LAYERS * local * 2
        assert sorted({op.phase for op in gathers}) == sorted({Phase.FWD, Phase.BWD})
        assert sum(op.size_bytes for op in reduces) == m * MOE_LAYERS * local * grad_bytes
        assert not any(isinstance(op.purpose, ExpertParamGather) for op in ops)
        # the dense part of an MoE layer over DP: attention, router and norms, no expert
        dense = [op for op in ops if isinstance(op.purpose, UnitGather) and op.layer == 1]
        attn = 4 * 256 * 256 + 256 * 8 + 2 * 256
        assert {op.size_bytes for op in dense} == {attn * 2}
        assert all(len(op.group) == 8 for op in dense)


def test_each_experts_gather_waits_as_the_dense_gather_and_the_layer_waits_for_both() -> None:
    plan = build(MOE, _layout())
    for ops in plan.ops.values():
        order = [type(op.purpose) for op in ops if op.layer == 2 and op.microbatch == 0
                 and op.phase is Phase.FWD]
        assert order[:2] == [UnitGather, ExpertUnitGather]


@pytest.mark.parametrize("ep", [2, 4])
def test_model_states_shard_dense_over_dp_and_experts_over_expert_dp(ep: int) -> None:
    """ZeRO 3: (2 + 2 + 12) bytes a parameter, dense / dp + experts / (dp / ep)."""
    layout = _layout(ep=ep)
    experts = MOE_LAYERS * MOE.experts // ep * EXPERT
    total = MOE.params_on_stages([0], 1, 1, MOE.layers, layers=list(range(MOE.layers)),
                                 ep=ep, etp=1)
    shards = (total - experts) / 8 + experts / (8 // ep)
    mem = memory_by_pp_rank(MOE, layout)[0]
    assert mem.params_bytes == pytest.approx(2 * shards, rel=1e-12)
    assert mem.grads_bytes == pytest.approx(2 * shards, rel=1e-12)
    assert mem.optimizer_bytes == pytest.approx(12 * shards, rel=1e-12)
    # working: two of its largest layer gathered whole (an MoE layer with its E/ep experts,
    # or the dense layer 0 with its fc1 and fc2) and one's gradients
    moe = MOE.layer_params(1, 1, ep, 1)
    assert moe == 4 * 256 * 256 + 256 * 8 + 2 * 256 + MOE.experts // ep * EXPERT
    dense = 4 * 256 * 256 + 3 * 256 * 512 + 2 * 256
    assert MOE.layer_params(1, 0, ep, 1) == dense
    zero1 = memory_by_pp_rank(MOE, _layout(ep=ep, zero=1))[0]
    assert mem.working_bytes - zero1.working_bytes == (2 * 2 + 2) * max(moe, dense)
