"""Issue 32 on two gloo ranks: a Qwen3-shaped block (heads of their own width, a·d = 48 on
hidden 32, and per-head qk_norm) runs its real plan under TP, TP+SP (with TE's overlap), CP
and, with routed experts, EP over TP, and trains as the
single-process reference; each rank's communication is its plan's (the qk_norm weights'
partial gradients summed over TP, as Megatron-Core does); the GEMMs do the plan's FLOPs."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.consistency import problems
from executor.launch import spawn
from executor.recorder import timed_trace
from executor.reference import train
from tests.executor.checks import check_training
from tests.executor.plan_match import call_sequences, plan_sequences
from tests.executor.workers import ADAMW, OPTIONS, QWEN3, Case, interpret_cases
from traces.plan import build
from traces.purpose import SpGrads

TIMEOUT_S = 60
WORLD2 = {
    "qwen3-tp": Case(dict(tp=2, global_batch=2), model=QWEN3),
    "qwen3-tp-sp-unfused-full": Case(dict(tp=2, sp=True, global_batch=2, recompute="full"),
                                     model=dict(QWEN3, attention="unfused")),
    "qwen3-layernorm-tp-selective": Case(dict(tp=2, global_batch=2, recompute="selective"),
                                         model=dict(QWEN3, norm="layernorm", bias=True)),
    "qwen3-cp2-ring": Case(dict(cp=2, global_batch=2), model=QWEN3),
    # torch's stacks: K/V at the query heads in the ring and the gather, dK/dV in fp32
    "qwen3-eager-cp2-ring": Case(dict(cp=2, global_batch=2), model=dict(QWEN3, kernels="eager")),
    "qwen3-compiled-cp2-gather": Case(dict(cp=2, cp_comm="all_gather", global_batch=2),
                                      model=dict(QWEN3, kernels="compiled")),
    # Transformer Engine's overlap: qkv's GEMM chunked beside its all-gather, then qk_norm
    "qwen3-tp-sp-comm-overlap": Case(dict(tp=2, sp=True, global_batch=2, tp_comm_overlap=True),
                                     model=QWEN3),
    # Qwen3-MoE-shaped: qk_norm in a layer whose MLP is routed experts (EP 2 over TP 2)
    "qwen3-moe-ep2-tp2-sp": Case(dict(tp=2, sp=True, ep=2, global_batch=2),
                                 model=dict(QWEN3, experts=4, top_k=2, moe_ffn_hidden=24,
                                            dense_layers=1)),
}
FLOPS = {"qwen3-tp-unfused": Case(dict(tp=2, global_batch=2),
                                  model=dict(QWEN3, attention="unfused"), steps=1)}


def _world(cases: dict[str, Case], count_flops: bool = False) -> dict[str, list]:
    results, _ = spawn(interpret_cases, 2, (list(cases.values()), count_flops),
                       timeout_s=TIMEOUT_S)
    return {name: list(per_rank) for name, per_rank in zip(cases, zip(*results))}


@pytest.fixture(scope="module")
def world2() -> dict[str, list]:
    return _world(WORLD2)


@pytest.mark.parametrize("name", list(WORLD2))
def test_qwen3_block_trains_as_the_reference(world2: dict, name: str) -> None:
    case = WORLD2[name]
    model, layout = case.specs()
    results = world2[name]
    check_training(model, layout, results,
                   train(model, layout.global_batch, case.steps, OPTIONS.seed, ADAMW,
                         layout=layout))
    plan = build(model, layout)
    for rank, result in enumerate(results):
        assert call_sequences(result["calls"]) == plan_sequences(plan.ops[rank]), f"rank {rank}"
    trace = timed_trace(plan, {r: res["records"] for r, res in enumerate(results)}, plan.meta)
    assert problems(trace, plan=plan) == []


def test_qk_norm_gradients_are_summed_over_tp_without_sp() -> None:
    """Without SP the only replicated weights whose gradients differ between TP ranks are
    qk_norm's (each rank back-propagates its heads): one all-reduce of 2d per layer."""
    model, layout = WORLD2["qwen3-tp"].specs()
    sums = [op for op in build(model, layout).ops[0] if isinstance(op.purpose, SpGrads)]
    assert len(sums) == model.layers
    assert {op.size_bytes for op in sums} == {2 * model.head_dim * 4}  # fp32 gradients


def test_gemms_do_the_plans_flops() -> None:
    """torch.utils.flop_counter around each op: qkv, proj and the unfused core with a query
    48 wide on hidden 32 do their planned FLOPs, every other op (qk_norm included) none."""
    for name, per_rank in _world(FLOPS, count_flops=True).items():
        model, layout = FLOPS[name].specs()
        plan = build(model, layout)
        for rank, res in enumerate(per_rank):
            for index, op in enumerate(plan.ops[rank]):
                if op.kind != "compute":
                    continue
                want = op.flops if op.gemm else 0.0
                assert res["flops"][index] == want, (name, rank, index, op.name, op.phase)
