"""MoE in the executor (issue 19, item 5): EP all-to-alls on gloo, the plan's routing, capacity
dropping; training equals the single-process reference for EP 2 and EP 2 x TP 2 (SP), with
and without capacity dropping, balanced and skewed (also EP 4, latent attention, GeLU experts,
ZeRO 1, pipeline stages, CP, full and selective recomputation, TP overlap), the gradient norm
included; every call is the plan's, and each all-to-all moves the routed tokens (its splits
are `traces.moe.dispatch_matrix`'s rows and columns); the experts do the plan's FLOPs. Two
spawned worlds (2 and 4 ranks) run every case."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")  # the executor runs on torch

import torch

from executor.comm import CommCall
from executor.consistency import problems
from executor.launch import spawn
from executor.moe import routed_tokens
from executor.options import check_supported
from executor.recorder import timed_trace
from executor.reference import routing_groups, train
from executor.routing import expert_major, route
from tests.executor.checks import check_training
from tests.executor.plan_match import call_sequences, plan_sequences
from tests.executor.workers import ADAMW, LLAMA, MLA, OPTIONS, SMALL, Case, interpret_cases
from traces.errors import ConfigError
from traces.expert_grid import ep_coord, ep_group
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe import dispatch_matrix
from traces.moe_spec import expert_counts, is_moe_layer
from traces.ops import OpKind, Trace
from traces.plan import build
from traces.purpose import ExpertAllToAll, Kernel, KernelRun, MoeStep, SpGrads

TIMEOUT_S = 120
MOE = dict(LLAMA, experts=4, top_k=2, moe_ffn_hidden=24, dense_layers=1)
"""SMALL's Llama block with 4 experts of 24 (top 2) in layer 1; layer 0 dense."""
SKEW = dict(MOE, routing_skew=1.5)
WORLD2 = {
    "ep2-dp2": Case(dict(ep=2, dp=2, global_batch=4), model=MOE),
    # skewed and capped: the popular experts drop tokens, the EP splits are uneven
    "ep2-dp2-skew-capacity": Case(dict(ep=2, dp=2, global_batch=4),
                                  model=dict(SKEW, capacity_factor=1.0)),
    # ZeRO 1 shards the dense states over DP; each expert lives on one rank (expert-DP 1)
    "ep2-dp2-zero1-skew": Case(dict(ep=2, dp=2, zero=1, global_batch=4), model=SKEW),
    "ep2-dp2-gelu-skew-2mb": Case(dict(ep=2, dp=2, micro_batch=2, global_batch=8),
                                  model=dict(SKEW, ffn="gelu", ffn_hidden=64)),
    "ep2-tp2-sp-skew-selective": Case(dict(tp=2, sp=True, ep=2, global_batch=2,
                                           recompute="selective"), model=SKEW),
    "ep2-tp2-sp-capacity": Case(dict(tp=2, sp=True, ep=2, global_batch=2),
                                model=dict(MOE, capacity_factor=0.5)),
    # Megatron-Core's TP overlap: the dense layer's GEMMs chunked beside their collectives
    "ep2-tp2-sp-comm-overlap": Case(dict(tp=2, sp=True, ep=2, global_batch=2,
                                         tp_comm_overlap=True), model=SKEW),
    # full recomputation re-runs the MoE layer, its exchanges included, before its backward
    "ep2-dp2-skew-full": Case(dict(ep=2, dp=2, global_batch=4, recompute="full"),
                              model=dict(SKEW, capacity_factor=1.0)),
    "mla-ep2-dp2": Case(dict(ep=2, dp=2, global_batch=4),
                        model=dict(MLA, **{k: MOE[k] for k in ("experts", "top_k",
                                                               "moe_ffn_hidden",
                                                               "dense_layers")})),
}
WORLD4 = {
    # the experts' gradients all-reduced over expert-DP (0, 2) and (1, 3)
    "ep2-tp2-sp-dp2-skew-capacity": Case(dict(tp=2, sp=True, ep=2, dp=2, global_batch=4),
                                         model=dict(SKEW, capacity_factor=1.0)),
    "ep4-dp4-skew": Case(dict(ep=4, dp=4, global_batch=4), model=dict(SKEW, routing_skew=2.0)),
    # MoE layers on both stages (1 dense, 3 MoE), tied embeddings across them
    # context parallelism: each rank routes its two chunks of the sequence
    "ep2-cp2-tp2-sp-skew": Case(dict(cp=2, tp=2, sp=True, ep=2, micro_batch=2,
                                     global_batch=2), model=SKEW),
    "ep2-pp2-dp2-skew": Case(dict(pp=2, dp=2, ep=2, global_batch=4), model=dict(SKEW, layers=4)),
}
CASES = {**WORLD2, **WORLD4}


def _world(cases: dict[str, Case], size: int, count_flops: bool = False) -> dict[str, list]:
    results, _ = spawn(interpret_cases, size, (list(cases.values()), count_flops),
                       timeout_s=TIMEOUT_S)
    return {name: list(per_rank) for name, per_rank in zip(cases, zip(*results))}


@pytest.fixture(scope="module")
def worlds() -> dict[str, list]:
    return {**_world(WORLD2, 2, count_flops=True), **_world(WORLD4, 4)}


@pytest.mark.parametrize("name", list(CASES))
def test_training_equals_the_reference(worlds: dict, name: str) -> None:
    model, layout = CASES[name].specs()
    run = train(model, layout.global_batch, CASES[name].steps, OPTIONS.seed, ADAMW,
                layout=layout)
    results = worlds[name]
    worst = check_training(model, layout, results, run)
    assert worst["param"] <= 1e-6
    for res in results:  # the last step's norm: every expert and dense gradient once
        assert res["grad_norm"] == pytest.approx(run.grad_norms[-1], rel=1e-5)
    experts = [n for res in results for t in res["params"].values() for n in t
               if n.startswith("experts.")]
    moe = [layer for res in results for layer in layout.layers_of_stage(model, res["coords"].pp)
           if is_moe_layer(model, layer)]
    assert len(experts) == 2 * len(moe), "every rank's experts were compared"
    plan = build(model, layout)
    trace = timed_trace(plan, {r: res["records"] for r, res in enumerate(results)}, plan.meta)
    assert trace.meta.complete is True
    assert problems(trace, plan=plan) == []


@pytest.mark.parametrize("name", list(CASES))
def test_calls_are_the_plans_and_all_to_alls_move_the_routed_tokens(worlds: dict,
                                                                   name: str) -> None:
    """Call for call the plan's; an all-to-all's bytes are the rows it really sends: the
    kept assignments A (dispatch, and the combine's gradient) or the rows this rank's experts
    received, EP·L (combine, and the dispatch's gradient), times h·e."""
    model, layout = CASES[name].specs()
    plan = build(model, layout)
    skewed = model.routing_skew > 0
    for rank, res in enumerate(worlds[name]):
        want = plan_sequences(_real_sizes(plan, model, layout, rank))
        assert call_sequences(res["calls"]) == want, f"rank {rank}"
        # the plan's own sizes: even when balanced, the rank's row of `Op.split` when skewed
        assert call_sequences(res["calls"]) == plan_sequences(plan.ops[rank], rank)
        if not skewed:  # even exchanges carry no split (capacity may even a skewed one)
            assert all(op.split is None for op in plan.ops[rank])
        _check_splits(model, layout, plan, rank, [c for c in res["calls"]
                                                  if c.kind is OpKind.ALL_TO_ALL])


def _real_sizes(plan: Trace, model: ModelSpec, layout: Layout, rank: int) -> tuple:
    """The rank's plan with each all-to-all sized by its real rows (the test's docstring),
    derived from the routed counts, independently of the plan's `Op.split`."""
    tokens = routed_tokens(model, layout)
    row = model.hidden * model.dtype_bytes
    ops = []
    for op in plan.ops[rank]:
        if isinstance(op.purpose, ExpertAllToAll):
            assert op.layer is not None and op.group == ep_group(layout, rank)
            counts = expert_counts(model, op.layer, tokens)
            n = model.experts // layout.ep
            mine = counts[ep_coord(layout, rank) * n:][:n]
            kept_rows, received = sum(counts), layout.ep * sum(mine)
            sends_tokens = (op.purpose.step is MoeStep.DISPATCH) != op.purpose.grad
            op = dataclasses.replace(op, split=None, size_bytes=(
                kept_rows if sends_tokens else received) * row)
        ops.append(op)
    return tuple(ops)


def _check_splits(model: ModelSpec, layout: Layout, plan: Trace, rank: int,
                  calls: list[CommCall]) -> None:
    """The plan's all-to-alls in order: a dispatch sends row i of the plan's byte matrix of
    its layer, a combine sends back column i; their gradients retrace them."""
    tokens = routed_tokens(model, layout)
    i = ep_coord(layout, rank)
    want = []
    for op in plan.ops[rank]:
        if isinstance(op.purpose, ExpertAllToAll):
            assert op.layer is not None
            matrix = dispatch_matrix(model, op.layer, tokens, layout.ep)
            row, column = tuple(round(x) for x in matrix[i]), tuple(round(r[i]) for r in matrix)
            sends_tokens = (op.purpose.step is MoeStep.DISPATCH) != op.purpose.grad
            want.append(row if sends_tokens else column)
            if op.split is not None:  # the plan's matrix is the routed one
                assert tuple(round(x) for x in op.split.send_splits(i)) == want[-1]
            assert sum(row) == sum(expert_counts(model, op.layer, tokens)) * model.hidden * 4
    assert want and [c.splits for c in calls] == want


@pytest.mark.parametrize("name", [n for n, c in WORLD2.items()  # chunked GEMMs run whole
                                  if not c.layout.get("tp_comm_overlap")])
def test_the_router_and_the_experts_do_the_plans_flops(worlds: dict, name: str) -> None:
    """torch.utils.flop_counter around each op of the first step: the router's GEMM and the
    dense GEMMs do their planned FLOPs; a grouped GEMM's ops (one per distinct token count)
    together do what the first of them does, the whole grouped GEMM; no other op any."""
    model, layout = CASES[name].specs()
    plan = build(model, layout)
    grouped = (Kernel.EXPERT_FC1, Kernel.EXPERT_FC2)
    for rank, res in enumerate(worlds[name]):
        counted = dict(zip(range(len(plan.ops[rank])), res["flops"]))
        first: dict[tuple, int] = {}
        planned: dict[tuple, float] = {}
        for index, op in enumerate(plan.ops[rank]):
            if op.name == "flash_attn" or op.kind != "compute":
                continue
            key = (op.name, op.phase, op.layer, op.microbatch)
            if isinstance(op.purpose, KernelRun) and op.purpose.kernel in grouped:
                first.setdefault(key, index)
                planned[key] = planned.get(key, 0.0) + op.flops
                if first[key] != index:
                    assert counted[index] == 0.0, (name, rank, index)
                continue
            assert counted[index] == (op.flops if op.gemm else 0.0), (name, rank, index, op.name)
        assert planned, "the plan has grouped GEMMs"
        for key, index in first.items():
            assert counted[index] == planned[key] > 0, (name, rank, key)


# --- routing, no processes --------------------------------------------------------------------

@pytest.mark.parametrize("skew, capacity, tokens", [(0.0, 0.0, 16), (1.5, 0.0, 8),
                                                    (1.5, 1.0, 16), (0.0, 0.5, 12),
                                                    (3.0, 0.0, 5)])
def test_routing_realizes_the_plans_counts_with_distinct_experts(skew: float, capacity: float,
                                                                 tokens: int) -> None:
    model = ModelSpec(**{**SMALL, **MOE, "experts": 8, "top_k": 3, "routing_skew": skew,
                         "capacity_factor": capacity})
    r = route(model, 1, tokens)
    assert tuple(torch.bincount(r.experts[r.kept], minlength=8).tolist()) == \
        expert_counts(model, 1, tokens) == r.counts
    for t in range(tokens):  # top-k: k distinct experts per token
        assert len(set(r.experts[t].tolist())) == 3
    dropless = route(dataclasses.replace(model, capacity_factor=0), 1, tokens)
    assert torch.equal(r.experts, dropless.experts)
    for e in range(8):  # capacity keeps each expert's first tokens
        routed = (dropless.experts == e).any(dim=1).nonzero().flatten().tolist()
        kept = ((r.experts == e) & r.kept).any(dim=1).nonzero().flatten().tolist()
        assert kept == routed[:len(kept)]
    # the permuted rows: kept assignments by expert, then token
    assert r.tokens.tolist() == [t for e in range(8) for t in range(tokens)
                                 if bool(((r.experts[t] == e) & r.kept[t]).any())]
    assert r.per_rank(2) == (sum(r.counts[:4]), sum(r.counts[4:]))


def test_expert_major_order_gathers_each_experts_rows_from_every_source() -> None:
    model = ModelSpec(**{**SMALL, **SKEW})
    r = route(model, 1, 16)
    local = r.local(2, 1)  # EP rank 1's two experts, rows from 2 sources
    per_source = sum(local)
    index, inverse = expert_major(model, 1, 16, 2, 1)
    assert torch.equal(index[inverse], torch.arange(2 * per_source))
    order = index.tolist()
    assert sorted(order) == list(range(2 * per_source))
    assert order[:2 * local[0]] == [*range(local[0]), *range(per_source,
                                                              per_source + local[0])]


def test_the_references_routing_groups_are_the_ranks_tokens() -> None:
    """DP rank 1's second micro-batch on TP rank 1 (SP): batch rows 3·2 + [0, 2), positions
    8-15 of 16, sequence first as the rank's [s/t, b] tensor."""
    layout = Layout(tp=2, sp=True, dp=2, micro_batch=2, global_batch=8)
    groups = routing_groups(layout, 16)
    assert len(groups) == 2 * 2 * 2
    want = [row * 16 + p for p in range(8, 16) for row in (6, 7)]
    assert groups[-1].tolist() == want
    # CP 2 x TP 2: CP rank 1 holds chunks 1 and 2 of 4 (positions 4-11), TP rank 0 of it 4-7
    groups = routing_groups(Layout(cp=2, tp=2, sp=True, global_batch=1), 16)
    assert [g.tolist() for g in groups] == [[0, 1, 2, 3], [12, 13, 14, 15], [4, 5, 6, 7],
                                            [8, 9, 10, 11]]


# --- what the plan says, no processes -------------------------------------------------------

def test_the_routers_gradient_is_summed_over_tp_under_sp() -> None:
    """SpGrads of an MoE layer covers its norms and its router (h·E), as the executor's
    replicated parameters are; a dense layer's the norms only."""
    model, layout = CASES["ep2-tp2-sp-capacity"].specs()
    sizes = {op.layer: op.size_bytes for op in build(model, layout).ops[0]
             if isinstance(op.purpose, SpGrads) and op.layer is not None}
    h = model.hidden
    assert sizes == {0: 2 * h * 4, 1: (2 * h + h * model.experts) * 4}


def test_the_norms_group_spans_every_rank_with_ep() -> None:
    """With EP > 1 the experts of one replica lie on other DP ranks: the gradient norm is
    all-reduced over every rank (ZeRO 0 too)."""
    model, layout = CASES["ep2-dp2"].specs()
    stats = [op for op in build(model, layout).ops[0] if op.name == "norm"]
    assert [op.group for op in stats] == [(0, 1)]


# --- refusals -------------------------------------------------------------------------------

@pytest.mark.parametrize("model, layout, message", [
    (dict(shared_experts=1), dict(ep=2, dp=2), "model.shared_experts: 1"),
    (dict(bias=True), dict(ep=2, dp=2), "model.bias: true"),
    (dict(), dict(ep=2, tp=2, sp=True, etp=2, dp=2), "parallel.etp: 2"),
])
def test_what_the_executor_does_not_run_is_one_line(model: dict, layout: dict,
                                                    message: str) -> None:
    spec = ModelSpec(**{**SMALL, **MOE, **model})
    lay = Layout(**{"global_batch": 4, **layout})
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as raised:
        check_supported(spec, lay)
    assert "\n" not in str(raised.value)
