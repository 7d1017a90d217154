"""ZeRO over the experts in the executor (issue 33, executor item): under ZeRO 1/2 each MoE
layer's routed experts are sharded over their expert-data-parallel group (reduce-scatter of
the gradients into the rank's slice, AdamW on the slice, all-gather of the updated slices),
the dense parameters over DP as before; under ZeRO 3 (FSDP with EP) the slices are gathered
per use beside the dense unit and freed with it, the gradients reduce-scattered after each
syncing backward (`executor.expert_fsdp`); with DP 1 the plan shards the experts as ZeRO 1/2
do, and with expert-DP 1 keeps them whole. Training equals the single-process reference, the
norm included, and each rank's calls are its plan's. Two spawned worlds (2 and 4 ranks)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the executor runs on torch

import torch

from executor.consistency import problems
from executor.expert_fsdp import ExpertUnits, expert_store
from executor.launch import spawn
from executor.memory import MemoryMeter
from executor.options import check_supported
from executor.recorder import timed_trace
from executor.reference import train
from sim.models.memory import model_state_bytes, pp_rank_memory
from sim.models.moe_memory import expert_shards, expert_zero
from sim.models.working_memory import rank_params
from tests.executor.checks import check_training
from tests.executor.plan_match import call_sequences, plan_sequences
from tests.executor.test_moe import MOE, SKEW
from tests.executor.workers import ADAMW, OPTIONS, SMALL, Case, interpret_cases
from traces.expert_grid import expert_grad_group
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe_spec import is_moe_layer
from traces.ops import OpKind
from traces.plan import build
from traces.purpose import ExpertGrads, ExpertParamGather, ExpertUnitGather, Unit

TIMEOUT_S = 120
WORLD2 = {
    # EP 1: both ranks hold all 4 experts, expert-DP 2 = DP
    "ep1-dp2-zero1": Case(dict(dp=2, zero=1, global_batch=4), model=MOE),
    "ep1-dp2-zero2-skew-2mb": Case(dict(dp=2, zero=2, micro_batch=1, global_batch=4),
                                   model=SKEW),
    # DP 1: the dense states whole, the experts sharded over the TP ranks (expert-DP 2)
    "ep1-tp2-sp-zero3": Case(dict(tp=2, sp=True, zero=3, global_batch=2), model=SKEW),
    # FSDP of the dense units; each expert on one rank (expert-DP 1), kept whole
    "ep2-dp2-zero3": Case(dict(ep=2, dp=2, zero=3, global_batch=4), model=SKEW),
    # FSDP with EP 1: the experts gathered over DP per use, 2 micro-batches, reduced per each
    "ep1-dp2-zero3-2mb-sync": Case(dict(dp=2, zero=3, micro_batch=1, global_batch=4,
                                        grad_sync="microbatch"), model=SKEW),
}
WORLD4 = {
    # expert-DP groups (0, 2) and (1, 3); the gathers beside the next step's forward
    "ep2-dp4-zero1-overlap-gather": Case(dict(ep=2, dp=4, zero=1, global_batch=8,
                                              overlap_param_gather=True), model=SKEW),
    "ep2-tp2-sp-dp2-zero2-capacity": Case(dict(tp=2, sp=True, ep=2, dp=2, zero=2,
                                               global_batch=4),
                                          model=dict(SKEW, capacity_factor=1.0)),
    # DualPipe: each expert's states sharded over the pair of ranks holding its two copies
    "dualpipe-pp2-ep2-dp2-zero1": Case(dict(schedule="dualpipe", pp=2, dp=2, ep=2, zero=1,
                                            global_batch=8),
                                       model=dict(SKEW, layers=4, tied_embeddings=False)),
    # MoE Parallel Folding's FSDP+EP: experts over (0, 2) and (1, 3), dense units over all 4;
    # full recomputation re-runs the layer on what the backward's gathers brought in
    "ep2-dp4-zero3-full": Case(dict(ep=2, dp=4, zero=3, global_batch=8, recompute="full"),
                               model=SKEW),
    # FSDP with EP under TP (SP): experts over (0, 2) and (1, 3), dense units over DP (0, 2)
    "ep2-tp2-sp-dp2-zero3": Case(dict(tp=2, sp=True, ep=2, dp=2, zero=3, global_batch=4),
                                 model=SKEW),
    # and under a pipeline: the MoE layers of both stages gathered over DP (EP 1)
    "pp2-dp2-zero3": Case(dict(pp=2, dp=2, zero=3, global_batch=8),
                          model=dict(SKEW, layers=4, tied_embeddings=False)),
}
CASES = {**WORLD2, **WORLD4}


def _world(cases: dict[str, Case], size: int) -> dict[str, list]:
    results, _ = spawn(interpret_cases, size, (list(cases.values()),), timeout_s=TIMEOUT_S)
    return {name: list(per_rank) for name, per_rank in zip(cases, zip(*results))}


@pytest.fixture(scope="module")
def worlds() -> dict[str, list]:
    return {**_world(WORLD2, 2), **_world(WORLD4, 4)}


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
    moe = [layer for res in results for stage in layout.stages_of_rank(res["coords"].pp)
           for layer in layout.layers_of_stage(model, stage) if is_moe_layer(model, layer)]
    assert len(experts) == 2 * len(moe), "every rank's experts were compared"
    plan = build(model, layout)
    trace = timed_trace(plan, {r: res["records"] for r, res in enumerate(results)}, plan.meta)
    assert trace.meta.complete is True
    assert problems(trace, plan=plan) == []


@pytest.mark.parametrize("name", list(CASES))
def test_calls_are_the_plans(worlds: dict, name: str) -> None:
    """Call for call the plan's, the experts' reduce-scatters and gathers over expert-DP
    included wherever the plan shards them."""
    model, layout = CASES[name].specs()
    plan = build(model, layout)
    for rank, res in enumerate(worlds[name]):
        assert call_sequences(res["calls"]) == plan_sequences(plan.ops[rank], rank), rank
    kinds = {op.kind for op in plan.ops[0] if isinstance(op.purpose, ExpertGrads)}
    gathers = [op for op in plan.ops[0]
               if isinstance(op.purpose, ExpertParamGather | ExpertUnitGather)]
    sharded = len(expert_grad_group(layout, 0)) > 1
    assert kinds == ({OpKind.REDUCE_SCATTER} if sharded else set())
    per_use = layout.zero == 3 and layout.data_degree > 1  # before each forward and backward
    passes = 2 * layout.num_microbatches  # (full recomputation runs inside the backward's)
    layers = [layer for stage in layout.stages_of_rank(0)
              for layer in layout.layers_of_stage(model, stage) if is_moe_layer(model, layer)]
    assert len(gathers) == ((passes if per_use else 1) * len(layers) if sharded else 0)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.specs()[1].zero == 3])
def test_fsdp_keeps_only_its_slices_between_steps(worlds: dict, name: str) -> None:
    """After the steps (the last gathers, those that read the parameters out, freed again)
    each rank holds only its slices: the parameter bytes the simulator's memory model counts
    for it at ZeRO 3 (`sim.models.memory.pp_rank_memory`: the dense units over DP, the routed
    experts over expert-DP where the plan gathers them per use). At DP 1 the plan keeps the
    experts whole, ZeRO 1's way (their optimizer states sharded over expert-DP), and so does
    the memory model now (`sim.models.moe_memory.expert_zero`; it used to halve them)."""
    model, layout = CASES[name].specs()
    for res in worlds[name]:
        want = pp_rank_memory(model, layout, res["coords"].pp, []).params_bytes
        assert res["live"]["params"] == want


# --- no processes -----------------------------------------------------------------------------

@pytest.mark.parametrize("layout, group", [(dict(dp=2, zero=1), 2), (dict(ep=2, dp=4, zero=2), 2),
                                           (dict(dp=4, zero=1), 4), (dict(dp=4), 1),
                                           (dict(ep=2, dp=2, zero=1), 1),
                                           (dict(ep=2, dp=4, zero=3), 2), (dict(dp=2, zero=3), 2),
                                           (dict(ep=2, dp=2, zero=3), 1),
                                           (dict(tp=2, sp=True, zero=3), 2)])
def test_the_expert_states_are_the_ranks_slice(layout: dict, group: int) -> None:
    """Sharded, the g ranks of an expert-DP group update disjoint slices that tile each
    layer's experts; whole at ZeRO 0 or where the group is one rank. The rank's AdamW states
    and (ZeRO 3) kept parameters, in elements, are what the simulator's memory model counts
    for the routed experts (`sim.models.memory`: `model_state_bytes` over `expert_shards`, a
    path of its own, at the stage `expert_zero` says the plan holds them): 1/g of the rank's
    experts where ZeRO shards them, the parameters only where ZeRO 3 gathers them per use
    (whole at DP 1, where the plan reduces the experts once a step as at ZeRO 1). FSDP's
    slices hold no gradient between steps (`test_fsdp_gradients_peak_at_the_memory_models`)."""
    model = ModelSpec(**{**SMALL, **MOE})
    lay = Layout(global_batch=8, **layout)
    members = expert_grad_group(lay, 0)
    stores = [expert_store(model, lay, r, seed=1, grad_dtype=torch.float32,
                           device=torch.device("cpu"), meter=MemoryMeter(), adamw=ADAMW)
              for r in members]
    _, experts = rank_params(model, lay, 0)
    params, _, optimizer = model_state_bytes(experts, expert_shards(lay), expert_zero(lay), 1,
                                             param_bytes=1, grad_bytes=1)
    assert experts == 4 // lay.ep * (3 * MOE["moe_ffn_hidden"] * SMALL["hidden"])  # SwiGLU
    for store in stores:
        assert isinstance(store, ExpertUnits) == (lay.zero == 3 and group > 1 and lay.dp > 1)
        kept = store.kept if isinstance(store, ExpertUnits) else store.params
        assert sum(m.numel() for m in store.optimizer.m) == optimizer == experts / group
        assert kept.numel() == params
        fsdp = isinstance(store, ExpertUnits)
        assert store.shard.numel() == (experts // group if group > 1 and not fsdp else 0)
    if group > 1:
        slices = sorted(s.slice[1] for s in stores)
        whole = int(experts)
        assert slices == [(k * whole // group, (k + 1) * whole // group) for k in range(group)]


def test_zero_over_an_expert_dp_group_is_no_longer_refused() -> None:
    spec = ModelSpec(**{**SMALL, **MOE})
    for zero in (1, 2, 3):
        check_supported(spec, Layout(ep=2, dp=4, zero=zero, global_batch=4))


class _OneRank:
    """A reduce-scatter as if the other members sent zeros: this member's block of the input
    (enough to follow what the store holds, not what it sums)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def reduce_scatter(self, output, input, key, *, async_op=False, then=None) -> None:
        n = output.numel()
        output.copy_(input[self.index * n:(self.index + 1) * n])
        if then is not None:
            then()


@pytest.mark.parametrize("sync", ["step", "microbatch"])
def test_fsdp_gradients_peak_at_the_memory_models(sync: str) -> None:
    """FSDP with EP: the gradient bytes the store holds at their peak over two micro-batches
    are the memory model's for the routed experts: under "step" the full buffers alone (the
    rank's slices come as their reductions free the buffers; it used to keep a slice for
    every layer beside them: 3/2 of it), under "microbatch" the slices plus one layer's full
    buffer (`sim.models.working_memory.zero3_working_bytes`' per-layer gradients). None
    between steps (FSDP2's zero_grad sets them to None)."""
    model = ModelSpec(**{**SMALL, **MOE, "layers": 3})  # layers 1 and 2 MoE
    lay = Layout(dp=2, zero=3, global_batch=4, micro_batch=1, grad_sync=sync)
    meter = MemoryMeter()
    store = expert_store(model, lay, 0, seed=1, grad_dtype=torch.float32,
                         device=torch.device("cpu"), meter=meter, adamw=ADAMW)
    assert isinstance(store, ExpertUnits) and meter.live["grads"] == 0
    _, experts = rank_params(model, lay, 0)
    full, per_layer = 4 * experts, 4 * experts / len(store.layers)  # fp32 gradients
    want = model_state_bytes(experts, expert_shards(lay), expert_zero(lay), 1,
                             grad_bytes=4, full_grads=sync == "step")[1]
    if sync == "microbatch":
        want += per_layer
    peak = 0
    for mb in range(2):
        for layer in reversed(store.layers):
            for (at, name), (_, shape) in store.offsets.items():
                if at == layer and name:
                    store.accumulate(Unit.of_layer(layer), name, torch.ones(shape))
                    peak = max(peak, meter.live["grads"])
            if sync == "microbatch" or mb == 1:
                store.reduce(layer, _OneRank(0))  # type: ignore[arg-type]
    assert peak == want == (full if sync == "step" else full / 2 + per_layer)
    assert meter.live["grads"] == full / 2  # the slices, read by the optimizer
    assert [g.numel() for g in store.grad_segments()] == [experts / 2 / 2] * 2
    store.zero_()
    assert meter.live["grads"] == 0
