"""The host thread (`sim.engine.host`, `sim.models.host`): closed forms for a chain of kernels
launched one after another, host-bound and GPU-bound, and for a device-to-host sync; the
dropless dispatcher's syncs and the CUDA graphs' launches on a real MoE plan; the keys'
refusals."""

from __future__ import annotations

import dataclasses

import pytest

from sim.config import experiment_from_dict
from sim.engine.host import HostProgram, Sync
from sim.engine.replay import replay
from sim.models.compute import ComputeModel
from sim.models.host import (
    ATEN_OP_S,
    AUTOGRAD_NODE_S,
    LAUNCH_S,
    PY_OP_S,
    SYNC_S,
    GroupedHost,
    capacity_sync,
    capacity_syncs,
    dispatch_syncs,
    expert_cast_launches,
    host_cpu_factor,
    host_programs,
    launch_costs,
)
from sim.simulate import predict
from traces.errors import ConfigError
from traces.kernel_names import Kernel
from traces.ops import Op, OpKind, Phase, Trace
from traces.plan import build
from traces.purpose import ExpertAllToAll, KernelRun, MoeStep, RoutingMapGather


class _Seconds:
    """Each op takes its `flops` as seconds."""

    def duration(self, op: Op) -> float:
        return op.flops


def _chain(seconds: list[float]) -> Trace:
    return Trace({0: tuple(Op(kind=OpKind.COMPUTE, stream="compute", name=f"k{i}", flops=s)
                           for i, s in enumerate(seconds))})


def _step(h100, plan: Trace, program: HostProgram | None) -> tuple[float, list[float]]:
    times = replay(plan, h100, _Seconds(), hosts=None if program is None else {0: program})
    return times.step_time_s, times.starts[0]


def test_tiny_kernels_are_host_bound_one_launch_each(h100):
    n, launch, tiny = 50, 5e-6, 1e-7
    step, starts = _step(h100, _chain([tiny] * n), HostProgram.of([launch] * n))
    assert starts == pytest.approx([(i + 1) * launch for i in range(n)], rel=1e-12)
    assert step == pytest.approx(n * launch + tiny, rel=1e-12)
    assert _step(h100, _chain([tiny] * n), None)[0] == pytest.approx(n * tiny, rel=1e-12)


def test_big_kernels_are_gpu_bound_the_host_hidden_but_the_first_launch(h100):
    n, launch, big = 50, 5e-6, 1e-3
    step, starts = _step(h100, _chain([big] * n), HostProgram.of([launch] * n))
    assert step == pytest.approx(launch + n * big, rel=1e-12)
    assert starts == pytest.approx([launch + i * big for i in range(n)], rel=1e-12)


def test_a_sync_idles_the_gpu_for_exactly_the_sync_and_the_launches_after_it(h100):
    n, k, launch, big, sync = 20, 7, 5e-6, 1e-3, 6e-6
    costs = [launch] * n
    costs[k + 1] = 3 * launch  # the first op after the sync launches three kernels
    program = HostProgram.of(costs, [Sync(k + 1, k, sync)])
    step, starts = _step(h100, _chain([big] * n), program)
    end_k = launch + (k + 1) * big
    idle = sync + 3 * launch
    assert starts[k + 1] - end_k == pytest.approx(idle, rel=1e-9)
    assert step == pytest.approx(launch + n * big + idle, rel=1e-12)


def test_a_sync_on_another_stream_holds_every_later_launch(h100):
    """The host waits in program order: op 2 (another stream) waits for op 0's end though
    it depends on nothing."""
    ops = (Op(kind=OpKind.COMPUTE, stream="compute", flops=1e-3),
           Op(kind=OpKind.COMPUTE, stream="compute", flops=1e-3),
           Op(kind=OpKind.COMPUTE, stream="side", flops=1e-6))
    program = HostProgram.of([LAUNCH_S] * 3, [Sync(2, 0, SYNC_S)])
    _, starts = _step(h100, Trace({0: ops}), program)
    assert starts[2] == pytest.approx(LAUNCH_S + 1e-3 + SYNC_S + LAUNCH_S, rel=1e-12)
    assert starts[1] == pytest.approx(LAUNCH_S + 1e-3, rel=1e-12)


MOE = {"model": {"layers": 4, "hidden": 1024, "heads": 8, "seq_len": 1024, "vocab": 32000,
                 "ffn": "swiglu", "ffn_hidden": 2816, "norm": "rmsnorm", "position": "rope",
                 "bias": False, "experts": 8, "top_k": 2, "moe_ffn_hidden": 512},
       "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 16},
       "cluster": {"preset": "dgx-h100", "nodes": 1}}


def _moe(sim: dict[str, object], **model: object):
    data = {**MOE, "model": {**MOE["model"], **model}, "sim": sim}
    exp = experiment_from_dict(data)
    plan = build(exp.model, exp.layout, ranks=[0])
    return exp, plan


def test_the_dropless_dispatcher_syncs_once_per_forward_moe_layer_on_the_router():
    exp, plan = _moe({"host": True})
    ops = plan.ops[0]
    syncs = dispatch_syncs(ops)
    dispatches = [i for i, op in enumerate(ops) if isinstance(op.purpose, ExpertAllToAll)
                  and op.purpose.step is MoeStep.DISPATCH and op.phase is Phase.FWD]
    assert [s.position for s in syncs] == dispatches
    assert len(dispatches) == 4 * 2  # layers x micro-batches
    assert {ops[s.target].name for s in syncs} == {"aux_loss"}
    assert all(ops[s.position - 1].name == "permute" for s in syncs)
    hosts = host_programs(plan, exp.host, exp.model, exp.layout,
                          ComputeModel(exp.cluster.accelerator, exp.profile))
    assert hosts is not None and len(hosts[0].syncs) == 8
    _, dropping = _moe({"host": True}, capacity_factor=1.0)
    assert dispatch_syncs(dropping.ops[0]) == syncs  # the plan's ops, not the dropless sync


def test_a_capacity_factor_syncs_before_each_forward_permute():
    """Megatron-Core's "before_permutation_1" (token drop, no pad): the host waits, before it
    launches each forward permute, for the op before it (the router's aux_loss), SYNC_S more;
    the same count as the dropless syncs, one op earlier each."""
    exp, plan = _moe({"host": True}, capacity_factor=1.0)
    ops = plan.ops[0]
    syncs = capacity_syncs(ops)
    permutes = [i for i, op in enumerate(ops) if op.name == "permute" and op.phase is Phase.FWD]
    assert syncs == [Sync(i, i - 1, SYNC_S) for i in permutes]
    assert {ops[i - 1].name for i in permutes} == {"aux_loss"} and len(syncs) == 4 * 2
    hosts = host_programs(plan, exp.host, exp.model, exp.layout,
                          ComputeModel(exp.cluster.accelerator, exp.profile))
    assert hosts is not None and list(hosts[0].syncs) == syncs
    assert [s.position + 1 for s in syncs] == [s.position for s in dispatch_syncs(ops)]
    hybrid, _ = _moe({"host": True}, capacity_factor=1.0, dispatch="hybridep")
    assert not capacity_sync(hybrid.model)


def test_hybridep_syncs_on_its_routing_map_gather():
    """HybridEP reads the received count on the host after gathering the routing map and
    preprocessing it (`traces.plan.experts`), before any dispatch kernel: each forward
    dispatch's sync waits for the `RoutingMapGather` and holds the launch of the op after it
    (the permute), so the host's wait spans the EP group's gather."""
    _, plan = _moe({"host": True}, dispatch="hybridep")
    ops = plan.ops[0]
    syncs = dispatch_syncs(ops)
    assert len(syncs) == 4 * 2  # layers x micro-batches
    assert all(isinstance(ops[s.target].purpose, RoutingMapGather) for s in syncs)
    assert all(ops[s.position].name == "permute" and s.position == s.target + 1
               for s in syncs)
    assert all(isinstance(ops[s.position + 1].purpose, ExpertAllToAll) for s in syncs)


def test_a_cuda_graph_launches_each_graphed_stretch_once():
    exp, plan = _moe({"host": True, "cuda_graph_scope": "attn"})
    ops = plan.ops[0]
    plain = launch_costs(ops, {})
    graphed = launch_costs(ops, {}, exp.host.scopes)
    layer = [i for i, op in enumerate(ops)
             if op.phase is Phase.FWD and op.layer == 0 and op.microbatch == 0]
    names = [ops[i].name for i in layer]
    first, last = layer[names.index("ln1")], layer[names.index("bda1")]
    assert "flash_attn" in names[names.index("ln1"):names.index("bda1")]
    assert graphed[first] == LAUNCH_S and not any(graphed[first + 1:last + 1])
    assert sum(plain[first:last + 1]) == pytest.approx((last - first + 1) * LAUNCH_S)
    assert graphed[last + 1:layer[-1] + 1] == plain[last + 1:layer[-1] + 1]  # the MoE part
    assert ops[last + 1].name == "ln2"
    backward = [i for i, op in enumerate(ops) if op.phase is Phase.BWD and op.layer == 0
                and op.microbatch == 0 and op.name in ("qkv", "flash_attn", "proj")]
    assert backward and not any(graphed[i] for i in backward[1:])


@pytest.mark.parametrize("sim, message", [
    ({"host": True, "cuda_graph_scope": "attn full"}, "sim.cuda_graph_scope: 'full' is not"),
    ({"host": True, "cuda_graph_scope": "moe_preprocess"}, "needs \"moe_router\""),
    ({"cuda_graph_scope": "attn"}, "needs sim.host = true"),
    ({"host": "yes"}, "sim.host"),
])
def test_bad_host_keys_are_one_line_errors(sim, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        experiment_from_dict({**MOE, "sim": sim})
    assert "\n" not in str(info.value)


def test_a_grouped_expert_gemm_launches_one_cublas_gemm_per_local_expert():
    """TE's grouped GEMM loops over the experts (cublaslt_gemm.cu's multi_stream_cublas_gemm):
    32 experts over EP 8 give 4 kernels per expert GEMM forward, 8 backward, as many as
    SequentialMLP's one op per expert launches."""
    _, grouped = _moe({"host": True}, experts=32)
    _, sequential = _moe({"host": True}, experts=32, moe_grouped_gemm=False)

    def per_pass(plan: Trace) -> dict[tuple[str, Phase], float]:
        ops = plan.ops[0]
        costs = launch_costs(ops, {})
        out: dict[tuple[str, Phase], float] = {}
        for op, cost in zip(ops, costs, strict=True):
            if op.layer == 0 and op.microbatch == 0 and op.name.startswith("expert_fc"):
                out[(op.name, op.phase)] = out.get((op.name, op.phase), 0.0) + cost
        return out

    expected = {(name, phase): (4 if phase is Phase.FWD else 8) * LAUNCH_S
                for name in ("expert_fc1", "expert_fc2") for phase in (Phase.FWD, Phase.BWD)}
    assert per_pass(grouped) == pytest.approx(expected, rel=1e-12)
    assert per_pass(sequential) == pytest.approx(expected, rel=1e-12)


def _expert_launches(plan: Trace, casts: int) -> dict[tuple[str, Phase], float]:
    """The CPU seconds of layer 0's expert GEMM and cast ops in micro-batch 0, per (name,
    phase)."""
    ops = plan.ops[0]
    out: dict[tuple[str, Phase], float] = {}
    for op, cost in zip(ops, launch_costs(ops, {}, casts=casts), strict=True):
        if op.layer == 0 and op.microbatch == 0 and op.name.startswith(("expert_fc",
                                                                         "expert_cast")):
            out[(op.name, op.phase)] = out.get((op.name, op.phase), 0.0) + cost
    return out


@pytest.mark.parametrize(("recipe", "casts"), [("mxfp8", 4), ("tensorwise", 8),
                                               ("blockwise", 4), ("delayed", 1)])
def test_fp8_experts_quantize_each_experts_input_and_gradient_on_its_own(recipe, casts):
    """TE's split_quantize fuses the experts' quantization into one kernel only for delayed
    scaling (cast.cpp multi_tensor_quantize_impl); otherwise one quantize per local expert,
    current scaling's an amax pass and a cast. 32 experts over EP 8: each expert cast op
    launches 4 kernels with MXFP8, 8 with current scaling, 1 with delayed scaling; the GEMMs
    stay 4 forward and 8 backward, and each GEMM has its input's cast forward and its
    gradient's backward."""
    data = {**MOE, "model": {**MOE["model"], "experts": 32, "dtype": "fp8",
                             "fp8_recipe": recipe},
            "cluster": {"preset": "dgx-b200", "nodes": 1}, "sim": {"host": True}}
    exp = experiment_from_dict(data)  # Blackwell: MXFP8 needs its block scaling
    plan = build(exp.model, exp.layout, ranks=[0])
    assert expert_cast_launches(exp.model, exp.layout) == casts
    gemms = {(name, phase): (4 if phase is Phase.FWD else 8) * LAUNCH_S
             for name in ("expert_fc1", "expert_fc2") for phase in (Phase.FWD, Phase.BWD)}
    quantize = {("expert_cast", Phase.FWD): 2 * casts * LAUNCH_S,
                ("expert_cast_grad", Phase.BWD): 2 * casts * LAUNCH_S}
    assert _expert_launches(plan, casts) == pytest.approx({**gemms, **quantize}, rel=1e-12)
    bf16, _ = _moe({"host": True}, experts=32)
    assert expert_cast_launches(bf16.model, bf16.layout) == 0


def test_a_grace_host_pays_its_measured_ratio_on_every_launch_and_sync():
    """TE issue #2053's torch.nn.Linear forward CPU time: 37.08 us on GB200, 33.17 on GH200,
    13.48 on a DGX H100's Xeon; a GB200 rank's launches and syncs cost 37.08 / 13.48 times an
    H100 rank's, op for op; x86 parts pay LAUNCH_S and SYNC_S as they are."""
    assert host_cpu_factor("H100") == host_cpu_factor("B200") == 1.0
    assert host_cpu_factor("GB200") == pytest.approx(37.08 / 13.48, rel=1e-12)
    assert host_cpu_factor("GB300") == host_cpu_factor("GB200")
    assert host_cpu_factor("GH200") == pytest.approx(33.17 / 13.48, rel=1e-12)
    exp, plan = _moe({"host": True})
    gb200 = experiment_from_dict({**MOE, "cluster": {"preset": "gb200-nvl72", "nodes": 1,
                                                     "gpus_per_node": 8},
                                  "sim": {"host": True}})
    h100 = host_programs(plan, exp.host, exp.model, exp.layout,
                         ComputeModel(exp.cluster.accelerator, exp.profile))
    grace = host_programs(plan, gb200.host, gb200.model, gb200.layout,
                          ComputeModel(gb200.cluster.accelerator, gb200.profile))
    assert h100 is not None and grace is not None
    ratio = 37.08 / 13.48
    assert list(grace[0].prefix) == pytest.approx([c * ratio for c in h100[0].prefix],
                                                  rel=1e-12)
    assert [s.seconds for s in grace[0].syncs] == pytest.approx(
        [SYNC_S * ratio] * len(h100[0].syncs), rel=1e-12)


def test_hybridep_exposes_the_sync_and_one_launch_per_forward_moe_layer():
    """Kernels long against a launch (hidden and sequence 4096), so the host runs ahead of
    the GPU everywhere but at HybridEP's syncs: after each forward layer's gather the GPU idles
    for the sync (SYNC_S) and the fused permute's launch (LAUNCH_S); the step is the GPU's
    alone plus that, 4 layers x 2 micro-batches of it, and the first launch."""
    model = {**MOE["model"], "hidden": 4096, "heads": 32, "seq_len": 4096,
             "moe_ffn_hidden": 2048, "dispatch": "hybridep"}

    def step(host: bool) -> float:
        exp = experiment_from_dict({**MOE, "model": model, "sim": {"host": host}})
        return predict(exp)[0].step_time_s

    assert step(True) - step(False) == pytest.approx(4 * 2 * (SYNC_S + LAUNCH_S) + LAUNCH_S,
                                                     rel=1e-9)


def _fp8_experts(recipe: str = "tensorwise", **model: object):
    data = {**MOE, "model": {**MOE["model"], "experts": 32, "dtype": "fp8",
                             "fp8_recipe": recipe, **model},
            "cluster": {"preset": "dgx-b200", "nodes": 1}, "sim": {"host": True}}
    exp = experiment_from_dict(data)
    return exp, build(exp.model, exp.layout, ranks=[0])


def test_the_cited_per_op_costs():
    """pytorch issue #41383: ~2 us an op from Python, ~1 us from C++; huggingface/blog issue
    #1649's profile: the engine's evaluate_function 13.902 us a ViewBackward0 node, the node
    6.352 us of it."""
    assert (ATEN_OP_S, PY_OP_S) == (1e-6, 2e-6)
    assert round(AUTOGRAD_NODE_S * 1e6, 9) == 7.55


def test_a_grouped_linear_call_pays_its_splits_allocations_and_autograd_node():
    """TE GroupedLinear (grouped_linear.py @0069563), 32 experts over EP 8 = 4 a call, current
    scaling (2 quantize kernels an expert): forward, 4 GEMM launches + the input's split into 4
    views (C++) + the output's torch.empty (Python); backward, 8 GEMM launches + the gradient's
    split + the dgrad empty + 4 weight-gradient empties (Megatron's DDP) + the autograd node;
    each quantize call 8 kernel launches + 2 allocations per expert (TE issue #1499)."""
    exp, plan = _fp8_experts()
    grouped = GroupedHost.of(exp.model, exp.layout)
    assert grouped == GroupedHost(4, True)
    a, p, n, launch = ATEN_OP_S, PY_OP_S, AUTOGRAD_NODE_S, LAUNCH_S
    fwd, bwd, quant = 4 * a + p, 4 * (a + p) + p + n, 8 * a
    assert (grouped.forward_s, grouped.backward_s, grouped.quantize_s) == pytest.approx(
        (fwd, bwd, quant), rel=1e-12)
    ops = plan.ops[0]
    costs = launch_costs(ops, {}, casts=8, grouped=grouped)
    out: dict[tuple[str, Phase], float] = {}
    for op, cost in zip(ops, costs, strict=True):
        if op.layer == 0 and op.microbatch == 0 and op.name.startswith(("expert_fc",
                                                                         "expert_cast")):
            out[(op.name, op.phase)] = out.get((op.name, op.phase), 0.0) + cost
    expected = {("expert_fc1", Phase.FWD): 4 * launch + fwd,
                ("expert_fc2", Phase.FWD): 4 * launch + fwd,
                ("expert_fc1", Phase.BWD): 8 * launch + bwd,
                ("expert_fc2", Phase.BWD): 8 * launch + bwd,
                ("expert_cast", Phase.FWD): 2 * (8 * launch + quant),
                ("expert_cast_grad", Phase.BWD): 2 * (8 * launch + quant)}
    assert out == pytest.approx(expected, rel=1e-12)


def test_host_programs_add_exactly_the_grouped_linear_work_per_layer_and_micro_batch():
    """The rank's whole host program (4 layers x 2 micro-batches, two GroupedLinear calls a
    layer) costs the launches alone plus 2 x (forward + backward + 2 quantize calls) per layer
    and micro-batch, nothing else; a GB200 host pays it at its measured ratio too."""
    exp, plan = _fp8_experts()
    ops = plan.ops[0]
    hosts = host_programs(plan, exp.host, exp.model, exp.layout,
                          ComputeModel(exp.cluster.accelerator, exp.profile))
    assert hosts is not None
    compute = ComputeModel(exp.cluster.accelerator, exp.profile)
    alone = sum(launch_costs(ops, compute, exp.host.scopes, 8))
    g = GroupedHost(4, True)
    per_layer = 2 * (g.forward_s + g.backward_s + 2 * g.quantize_s)
    assert hosts[0].prefix[-1] - alone == pytest.approx(4 * 2 * per_layer, rel=1e-9)


def test_bf16_grouped_experts_allocate_no_quantize_buffers_and_sequential_mlp_none():
    bf16, _ = _moe({"host": True}, experts=32)
    assert GroupedHost.of(bf16.model, bf16.layout) == GroupedHost(4, False)
    assert GroupedHost(4, False).quantize_s == 0.0
    sequential, _ = _moe({"host": True}, experts=32, moe_grouped_gemm=False)
    assert GroupedHost.of(sequential.model, sequential.layout) is None
    torch_stack = dataclasses.replace(bf16.model, kernels="compiled")  # torch._grouped_mm
    assert GroupedHost.of(torch_stack, bf16.layout) is None


def test_a_skewed_calls_ops_share_its_per_call_costs_by_their_experts():
    """Under skewed routing a GroupedLinear call is one op per distinct token count
    (`traces.moe_steps.expert_gemms`): an op of 1 of 4 experts pays a quarter of the call's
    forward work and one of 3 three quarters, so the call pays it once."""
    g = GroupedHost(4, True)

    def op(experts: int, phase: Phase) -> Op:
        return Op(kind=OpKind.COMPUTE, stream="compute", name="expert_fc1",
                  purpose=KernelRun(Kernel.EXPERT_FC1), phase=phase,
                  gemm=(experts, 512, 1024, 2048))

    assert g.op_s(op(1, Phase.FWD)) + g.op_s(op(3, Phase.FWD)) == pytest.approx(g.forward_s)
    assert g.op_s(op(1, Phase.FWD)) == pytest.approx(g.forward_s / 4, rel=1e-12)
    assert g.op_s(op(3, Phase.BWD)) == pytest.approx(0.75 * g.backward_s, rel=1e-12)
    norm = Op(kind=OpKind.COMPUTE, stream="compute", name="ln2",
              purpose=KernelRun(Kernel.LN2), phase=Phase.FWD)
    assert g.op_s(norm) == 0.0


def test_after_a_sync_the_gpu_idles_for_the_grouped_linears_whole_host_work(h100):
    """A sync, then a forward expert GEMM (4 experts) and its backward, kernels short against
    their launches: the GPU idles from the sync's target's end for SYNC_S and each op's whole
    host cost, 4 GEMM launches + the split and empty forward, 8 + the split, the empties and
    the autograd node backward, op after op (nothing hides it)."""
    g = GroupedHost(4, False)
    tiny = 1e-7

    def gemm(phase: Phase) -> Op:
        return Op(kind=OpKind.COMPUTE, stream="compute", name="expert_fc1",
                  purpose=KernelRun(Kernel.EXPERT_FC1), phase=phase, flops=tiny,
                  gemm=(4, 512, 1024, 2048))

    ops = (Op(kind=OpKind.COMPUTE, stream="compute", name="gather", flops=1e-3),
           gemm(Phase.FWD), gemm(Phase.BWD))
    costs = launch_costs(ops, {}, grouped=g)
    assert costs[1:] == pytest.approx([4 * LAUNCH_S + g.forward_s, 8 * LAUNCH_S + g.backward_s],
                                      rel=1e-12)
    step, starts = _step(h100, Trace({0: ops}), HostProgram.of(costs, [Sync(1, 0, SYNC_S)]))
    end = LAUNCH_S + 1e-3
    assert starts[1] == pytest.approx(end + SYNC_S + costs[1], rel=1e-12)
    assert starts[2] == pytest.approx(end + SYNC_S + costs[1] + costs[2], rel=1e-12)
    assert step == pytest.approx(end + SYNC_S + costs[1] + costs[2] + tiny, rel=1e-12)
