"""The analytic tier of `parasim search` against the simulator it shares its parts with: equal
where nothing overlaps or contends, the same memory, the same gradient buckets."""

import dataclasses
import itertools

import pytest

from sim.config import experiment_from_dict
from sim.models.compute import ComputeModel
from sim.models.interference import NO_INTERFERENCE
from sim.models.memory import memory_by_pp_rank
from sim.search.analytic import Analytic
from sim.search.passes import PassKey, gradient_buckets
from sim.search.stage_time import beside
from sim.simulate import predict
from topology.variability import Variability
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import OpKind, Stream
from traces.plan import build
from traces.purpose import ExpertUnitGather

MODEL = {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024, "vocab": 32000}


def experiment(parallel, gpus_per_node=8, nodes=1, **model):
    return experiment_from_dict({
        "model": {**MODEL, **model}, "parallel": parallel,
        "cluster": {"preset": "dgx-a100", "nodes": nodes, "gpus_per_node": gpus_per_node}})


def both(exp):
    estimate = Analytic(exp.model, exp.cluster, exp.profile).estimate(exp.layout)
    summary, _ = predict(exp)
    return estimate, summary

def busiest_compute_s(exp):
    """The busiest rank's kernels: the full plan's compute ops timed by the compute model."""
    layout = exp.layout
    plan = build(exp.model, layout, ranks=layout.representatives())
    compute = ComputeModel(exp.cluster.accelerator, exp.profile)
    return max(sum(compute.duration(op) for op in ops if op.kind is OpKind.COMPUTE)
               for ops in plan.ops.values())



@pytest.mark.parametrize(("recompute", "attention"),
                         list(itertools.product(("none", "selective", "full"),
                                                ("flash", "unfused"))))
def test_one_gpu_the_estimate_is_the_simulation(recompute, attention):
    """Nothing to overlap or share: both add the same kernels' times, micro-batch by
    micro-batch, and the optimizer."""
    exp = experiment({"global_batch": 4, "recompute": recompute}, gpus_per_node=1,
                     attention=attention)
    estimate, summary = both(exp)
    assert estimate.step_time_s == pytest.approx(summary.step_time_s, rel=1e-12)
    assert estimate.compute_s == pytest.approx(summary.compute_s, rel=1e-12)
    assert estimate.peak_memory_bytes == summary.peak_memory_bytes


@pytest.mark.parametrize(("parallel", "within"), [
    ({"tp": 8}, 1e-9),                                          # TP collectives inline
    ({"tp": 8, "zero": 3}, 1e-9),                               # dp = 1: ZeRO adds nothing
    # SP, recomputed collectives; SP's replicated-gradient all-reduces of the last backward
    # run on the DP stream beside the next layer's first kernels, which the simulation slows
    # from the instant they start together (issue 33) and the screen does not: 0.012%
    ({"tp": 4, "dp": 2, "sp": True, "recompute": "full"}, 2e-4),
    ({"tp": 2, "dp": 4, "overlap_grad_reduce": False}, 1e-9),   # buckets after the backward
    ({"dp": 8, "zero": 1, "overlap_grad_reduce": False}, 1e-9), # + the parameter all-gather
    ({"dp": 8, "zero": 2, "overlap_grad_reduce": False}, 1e-9),
])
def test_one_node_without_overlap_the_estimate_is_the_simulation(parallel, within):
    """The same collectives, lowered by the same algorithm, alone on the network: the
    alpha-beta time of the lowering is the flow model's time."""
    estimate, summary = both(experiment({"global_batch": 8, **parallel}))
    assert estimate.step_time_s == pytest.approx(summary.step_time_s, rel=within)


@pytest.mark.parametrize("parallel", [
    {"pp": 2, "tp": 4},
    {"pp": 4, "dp": 2},
    {"pp": 2, "dp": 4, "zero": 1},
    {"tp": 8, "sp": True},
    {"pp": 2, "tp": 2, "dp": 2, "vp": 2, "schedule": "interleaved"},
])
def test_with_a_pipeline_or_overlap_the_estimate_stays_close(parallel):
    """Closed-form bubble and overlap: not the simulation's exact order, but near it."""
    estimate, summary = both(experiment({"global_batch": 16, **parallel}))
    assert estimate.step_time_s == pytest.approx(summary.step_time_s, rel=0.05)


@pytest.mark.parametrize(("parallel", "within"), [
    ({"tp": 8, "sp": True, "tp_comm_overlap": True}, 0.01),
    ({"tp": 4, "dp": 2, "sp": True, "recompute": "full", "tp_comm_overlap": True}, 0.01),
    ({"tp": 2, "dp": 4, "sp": True, "zero": 1, "overlap_param_gather": True,
      "tp_comm_overlap": True}, 0.06),
])
def test_with_megatron_cores_overlaps_the_estimate_stays_close(parallel, within):
    """Each tp_comm_overlap region by its closed form (traces.plan.overlap.region_seconds):
    the simulation differs only where the chunks share NVLink with the SP gradients'
    all-reduces. overlap_param_gather's gathers are left out of the estimate as hidden under
    the forward; the simulation exposes the first (3% of this small step, whose ring
    exchanges are one neighbour copy each: 5.5% apart in all)."""
    estimate, summary = both(experiment({"global_batch": 8, **parallel}))
    assert estimate.step_time_s == pytest.approx(summary.step_time_s, rel=within)


def test_zero3_misses_only_what_its_streams_contend_for():
    """ZeRO-3's gathers and reduce-scatters run at once on the same links in the simulation
    and slow each other; the estimate times each alone. The kernels beside them run on the
    SMs and HBM bandwidth NCCL leaves (sim.models.interference.GpuInterference) in both: the
    estimate was 17% short before it counted that, and is within 5% now. (3.9% over since the
    simulation slows a kernel only while a transfer is in flight, issue 33, and once whatever
    number are: the screen adds the gathers' and reduce-scatters' times beside the compute.)"""
    estimate, summary = both(experiment({"global_batch": 16, "dp": 8, "zero": 3}))
    assert estimate.step_time_s == pytest.approx(summary.step_time_s, rel=0.05)


@pytest.mark.parametrize(("parallel", "closer"), [
    ({"dp": 8, "zero": 3}, 0.10),       # 17% short alone, 3% beside
    ({"dp": 8, "zero": 2}, 0.02),       # reduce-scatters after every micro-batch
    ({"dp": 8}, 0.015),                 # buckets beside the last backward
])
def test_kernels_beside_communication_bring_the_estimate_to_the_simulation(parallel, closer):
    """The same layout with interference off (a cluster where NCCL does not run its kernels:
    no `GpuInterference`) and on: counting the kernels that run beside the side streams and
    the DP reductions moves the estimate towards the simulation by at least `closer`."""
    exp = experiment({"global_batch": 16, **parallel})
    alone = Analytic(exp.model, exp.cluster, exp.profile)
    alone.interference = NO_INTERFERENCE
    before = alone.estimate(exp.layout).step_time_s
    estimate, summary = both(exp)
    assert before < estimate.step_time_s
    assert abs(estimate.step_time_s - summary.step_time_s) < \
        abs(before - summary.step_time_s)
    assert (estimate.step_time_s - before) / summary.step_time_s > closer


def test_beside_is_the_kernels_that_start_while_communication_is_in_flight():
    """10 s of kernels, 12 s beside communication: 3 s of it covers 2.5 s of kernels, which
    take 3 s; communication longer than the kernels beside it stretches them all."""
    assert beside(10.0, 12.0, 3.0) == pytest.approx(10.5)
    assert beside(10.0, 12.0, 20.0) == pytest.approx(12.0)
    assert beside(10.0, 10.0, 5.0) == 10.0
    assert beside(10.0, 12.0, 0.0) == 10.0


@pytest.mark.parametrize("parallel", [
    {"tp": 2, "dp": 4, "overlap_grad_reduce": False},
    {"dp": 8, "zero": 1, "overlap_grad_reduce": False},
])
def test_with_jitter_the_estimate_stretches_kernels_as_the_simulation_does(parallel):
    """Every rank of one stage waits for the slowest of the job (sim.models.variability's
    e_world); both stretch each kernel by it, so where nothing overlaps they stay equal."""
    exp = experiment({"global_batch": 8, **parallel})
    varied = dataclasses.replace(exp, cluster=dataclasses.replace(
        exp.cluster, variability=Variability(jitter=0.05)))
    estimate, summary = both(varied)
    assert estimate.step_time_s == pytest.approx(summary.step_time_s, rel=1e-9)
    ideal, _ = both(exp)
    assert estimate.step_time_s > 1.02 * ideal.step_time_s


def test_across_nodes_the_estimate_stays_close():
    exp = experiment({"global_batch": 32, "tp": 4, "pp": 2, "dp": 4, "zero": 1},
                     nodes=4, gpus_per_node=8)
    estimate, summary = both(exp)
    assert estimate.step_time_s == pytest.approx(summary.step_time_s, rel=0.05)


LAYOUTS = [
    Layout(tp=2, pp=2, dp=2, global_batch=8),
    Layout(tp=2, pp=4, dp=1, vp=2, global_batch=8, schedule="interleaved", recompute="full"),
    Layout(tp=1, pp=2, dp=4, global_batch=16, schedule="gpipe", zero=3, micro_batch=2),
    Layout(tp=4, pp=1, dp=2, global_batch=4, sp=True, recompute="selective", zero=2),
    Layout(tp=1, pp=8, dp=1, global_batch=16, fp32_main_grads=True),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_memory_is_the_memory_model(layout):
    model = ModelSpec(**{**MODEL, "layers": 8}, attention="unfused")
    exp = experiment({"global_batch": 8, "dp": 8})
    analytic = Analytic(model, exp.cluster, exp.profile)
    expected = memory_by_pp_rank(model, layout)
    assert analytic.memory(layout) == expected
    assert analytic.peak_memory(layout) == max(m.total_bytes for m in expected)


@pytest.mark.parametrize("layout", [
    Layout(tp=1, pp=1, dp=2, global_batch=4),
    Layout(tp=2, pp=2, dp=2, global_batch=8, zero=1),
    Layout(tp=1, pp=2, dp=2, vp=2, global_batch=8, schedule="interleaved", bucket_bytes=2**20),
    Layout(tp=1, pp=1, dp=4, global_batch=8, zero=2, fp32_main_grads=True,
           bucket_bytes=3 * 2**20),
])
def test_gradient_buckets_are_the_plans(layout):
    """The buckets the estimate reduces are the ones the plan builder makes (last
    micro-batch's backward, per pipeline rank)."""
    model = ModelSpec(**{**MODEL, "layers": 8})
    plan = build(model, layout, ranks=layout.representatives())
    last = layout.num_microbatches - 1
    for r in range(layout.pp):
        rank = layout.rank(pp=r)
        sizes = [op.size_bytes for op in plan.ops[rank] if op.stream == Stream.DP
                 and op.name == "grads" and op.microbatch == last]
        assert gradient_buckets(model, layout, r) == sizes


def test_compute_is_the_plans_kernels():
    """The busiest rank's kernel time: the plan's compute ops, each timed by the compute
    model (an independent path: the full plan, not the reduced one)."""
    exp = experiment({"global_batch": 16, "tp": 2, "pp": 2, "dp": 2, "recompute": "selective"})
    layout = exp.layout
    estimate = Analytic(exp.model, exp.cluster, exp.profile).estimate(layout)
    assert estimate.compute_s == pytest.approx(busiest_compute_s(exp), rel=1e-12)


@pytest.mark.parametrize("skew", [1.0, 2.0])
def test_a_skewed_all_to_all_is_timed_by_its_per_peer_sizes(skew):
    """Under routing skew the plan's dispatch and combine carry their uneven per-peer sizes
    (`Op.split`); the estimate times them as the replay lowers them (all-to-all-v), not as an
    even all-to-all of the same total, which brings it towards the simulation."""
    exp = experiment_from_dict({
        "model": {**MODEL, "experts": 16, "top_k": 2, "moe_ffn_hidden": 512,
                  "routing_skew": skew},
        "parallel": {"ep": 8, "dp": 8, "global_batch": 16},
        "cluster": {"preset": "dgx-h100", "nodes": 1}})
    even = Analytic(exp.model, exp.cluster, exp.profile)
    timed = even._collective
    even._collective = lambda kind, group, size, split=None: timed(kind, group, size)
    before = even.estimate(exp.layout).step_time_s
    estimate, summary = both(exp)
    assert before < estimate.step_time_s < summary.step_time_s
    assert (estimate.step_time_s - before) / summary.step_time_s > 0.04


def test_zero1_over_expert_dp_adds_each_moe_layers_expert_gather():
    """ZeRO-1 over an expert-DP group of two: after the step every MoE layer all-gathers its
    updated experts (`ExpertParamGather`); the estimate adds each alone on the network, and
    the plan's gathers are the size it times."""
    exp = experiment_from_dict({
        "model": {**MODEL, "experts": 8, "top_k": 2, "moe_ffn_hidden": 1024},
        "parallel": {"ep": 2, "dp": 4, "zero": 1, "overlap_grad_reduce": False,
                     "global_batch": 8},
        "cluster": {"preset": "dgx-a100", "nodes": 1, "gpus_per_node": 4}})
    analytic = Analytic(exp.model, exp.cluster, exp.profile)
    ops = analytic.pass_ops(exp.layout)
    plan = build(exp.model, exp.layout, ranks=[0]).ops[0]
    gathers = [op for op in plan if op.name == "expert_params"]
    assert len(gathers) == 4 and {op.size_bytes for op in gathers} == {ops.expert_gather}
    with_gathers = analytic.estimate(exp.layout).step_time_s
    analytic._passes[PassKey.of(exp.layout)] = dataclasses.replace(ops, expert_gather=0.0)
    without = analytic.estimate(exp.layout).step_time_s
    one = analytic._collective(OpKind.ALL_GATHER, gathers[0].group, ops.expert_gather)
    assert one > 0
    assert with_gathers - without == pytest.approx(4 * one, rel=1e-9)


def test_zero3_with_experts_times_each_layers_expert_gathers():
    """ZeRO-3 with EP 2 over DP 8: every MoE layer gathers its routed experts over expert-DP
    before its forward and its backward (`ExpertUnitGather`); the estimate's layer carries
    the plan's own gathers (same size, same stream), and stays within 5% of the simulation
    (1.2% over here)."""
    exp = experiment_from_dict({
        "model": {**MODEL, "experts": 8, "top_k": 2, "moe_ffn_hidden": 1024},
        "parallel": {"ep": 2, "dp": 8, "zero": 3, "global_batch": 16},
        "cluster": {"preset": "dgx-a100", "nodes": 1, "gpus_per_node": 8}})
    analytic = Analytic(exp.model, exp.cluster, exp.profile)
    layer = analytic.pass_ops(exp.layout).layer
    timed = [op for op, _ in layer.side_fwd + layer.side_bwd
             if isinstance(op.purpose, ExpertUnitGather)]
    plan = [op for op in build(exp.model, exp.layout, ranks=[0]).ops[0]
            if isinstance(op.purpose, ExpertUnitGather) and op.microbatch == 0]
    assert len(plan) == 2 * 4 and len(timed) == 2  # fwd and bwd of each of the 4 layers
    assert {(op.phase, op.size_bytes, op.stream) for op in timed} == \
        {(op.phase, op.size_bytes, op.stream) for op in plan}
    estimate, summary = analytic.estimate(exp.layout), predict(exp)[0]
    assert estimate.step_time_s == pytest.approx(summary.step_time_s, rel=0.05)
