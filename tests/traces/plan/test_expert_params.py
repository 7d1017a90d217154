"""ZeRO 1/2 with MoE: the routed experts' updated parameters all-gathered over the expert-DP
group after the step, the slices their gradients' reduce-scatter left each rank."""

from __future__ import annotations

import pytest

from traces.expert_grid import expert_data_group
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe_spec import is_moe_layer
from traces.ops import OpKind, Phase
from traces.plan import build
from traces.purpose import ExpertGrads, ExpertParamGather, Unit

MOE = ModelSpec(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000, ffn="swiglu",
                ffn_hidden=512, experts=8, top_k=2, moe_ffn_hidden=128, dense_layers=1,
                bias=False, norm="rmsnorm", position="rope")
EXPERT_PARAMS = 3 * 256 * 128  # one SwiGLU expert: gate, up and down, h x moe_ffn_hidden


def _layout(**kw: object) -> Layout:
    return Layout(**{"dp": 4, "ep": 2, "zero": 1, "micro_batch": 1, "global_batch": 8, **kw})


@pytest.mark.parametrize(("zero", "grad_bytes"), [(1, 4), (2, 2)])
def test_each_moe_layer_gathers_its_experts_over_expert_dp_after_the_step(
        zero: int, grad_bytes: int) -> None:
    layout = _layout(zero=zero, fp32_main_grads=grad_bytes == 4)
    plan = build(MOE, layout)
    moe_layers = [layer for layer in range(MOE.layers) if is_moe_layer(MOE, layer)]
    assert moe_layers == [1, 2, 3]
    for rank, ops in plan.ops.items():
        group = expert_data_group(layout, rank)
        assert len(group) == 2  # dp 4 / ep 2
        gathers = [op for op in ops if isinstance(op.purpose, ExpertParamGather)]
        reduces = [op for op in ops if isinstance(op.purpose, ExpertGrads)]
        assert [op.purpose.unit for op in gathers] == [Unit.of_layer(x) for x in moe_layers]
        for gather, reduce in zip(gathers, sorted(reduces, key=lambda op: op.layer or 0)):
            assert gather.kind is OpKind.ALL_GATHER and reduce.kind is OpKind.REDUCE_SCATTER
            assert gather.group == reduce.group == group
            # E/EP experts of this rank, as bf16 parameters (their gradients: the RS's bytes)
            assert gather.size_bytes == 8 / 2 * EXPERT_PARAMS * 2
            assert reduce.size_bytes / grad_bytes == gather.size_bytes / 2  # the same elements
            assert gather.phase is Phase.OPT
        assert ops.index(gathers[0]) > max(ops.index(op) for op in ops if op.phase is Phase.OPT
                                           and op.kind is OpKind.COMPUTE)


@pytest.mark.parametrize("layout", [_layout(zero=0), _layout(ep=4), _layout(zero=3, ep=2)],
                         ids=["zero 0", "expert-dp 1", "zero 3"])
def test_no_gather_where_expert_states_are_whole(layout: Layout) -> None:
    plan = build(MOE, layout)
    assert not any(isinstance(op.purpose, ExpertParamGather)
                   for ops in plan.ops.values() for op in ops)


def test_with_overlap_param_gather_the_experts_arrive_before_their_layers_forward() -> None:
    layout = _layout(overlap_param_gather=True)
    ops = build(MOE, layout).ops[0]
    for layer in (1, 2, 3):
        gather = next(i for i, op in enumerate(ops) if isinstance(op.purpose, ExpertParamGather)
                      and op.layer == layer)
        first = next(i for i, op in enumerate(ops) if op.layer == layer
                     and op.phase is Phase.FWD and op.kind is OpKind.COMPUTE)
        assert gather < first and gather in ops[first].deps  # the layer's forward waits


def test_an_moe_layers_replicated_biases_are_the_projections_alone() -> None:
    """With biases, a dense layer replicates two row-parallel biases (proj, fc2: 2h) beside
    its norms; an MoE layer only the projection's (h): its experts hold their own fc2 biases,
    as `ModelSpec.layer_params` counts them."""
    from traces.plan.nodes import RankContext

    model = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, experts=4, top_k=2,
                      moe_ffn_hidden=32, dense_layers=1)
    ctx = RankContext(model=model, layout=Layout(tp=2, sp=True, ep=2, dp=2, global_batch=4),
                      rank=0)
    dense, moe = ctx.replicated_params(Unit.of_layer(0)), ctx.replicated_params(Unit.of_layer(1))
    assert dense == 2 * 64 + 2 * model.norm_params
    assert moe == 64 + 2 * model.norm_params + 64 * 4  # proj's bias, norms, the router h·E
