"""The fit recovers what the simulator was given: microbenchmark plans timed by the replay with
known link figures and compute parameters, observed and fitted back (within 1%); and the pieces
it stands on — the gloo lowering, link overrides, profiles that carry roofs."""

from __future__ import annotations

import math

import pytest

from sim.calibrate.fit import fit_profile
from sim.calibrate.kernels import gemm_work
from sim.calibrate.observe import observe
from sim.collectives import Collectives, analytic_time
from sim.config import experiment_from_dict
from sim.engine.replay import replay
from sim.models.compute import ComputeModel
from sim.models.interference import host_interference
from sim.profile import (
    KERNEL_NAMES,
    AcceleratorRoofs,
    ComputeParams,
    KernelCost,
    LinkParams,
    Profile,
    default_profile,
    load_profile,
    profile_from_json,
)
from sim.simulate import predict
from topology import build_cluster
from topology.cluster import Cluster
from topology.override import link_figures, with_links
from traces.bench import BenchSpec, bench_plan, probe_grid, sweep_sizes
from traces.ops import OpKind

TRUE_LINK = LinkParams(bandwidth_Bps=1.3e9, latency_s=7e-6, call_s=3e-4)
TRUE_COMPUTE = ComputeParams(
    gemm_efficiency=0.6, gemm_tiles=((8, 8),), memory_efficiency=0.4, launch_overhead_s=3e-5,
    roofline_exponent=3.0,
    kernels={"flash_attn": KernelCost(flops_efficiency=0.3),
             "ln1": KernelCost(overhead_s=5e-5), "gelu": KernelCost(memory_efficiency=0.25),
             "optimizer": KernelCost(overhead_s=2e-4)})
PROBES = probe_grid("fp32", hidden=(64, 256), seq_len=(32, 128), micro_batch=(1, 4),
                    microbatches=1)


def synthesized(world: int, truth: Profile, preset: str = "localhost",
                interference_gemm: tuple[int, int, int] | None = (512, 512, 512)):
    """The microbenchmark plan timed by the replay on a cluster with the true figures."""
    cluster = build_cluster(preset, gpus_per_node=world)
    true_cluster = truth.applied_to(cluster)
    spec = BenchSpec(world=world, sizes=sweep_sizes(4096, 2**20, 4), repeats=1, probes=PROBES,
                     interference_gemm=interference_gemm)
    times = replay(bench_plan(spec), true_cluster, ComputeModel(true_cluster.accelerator, truth),
                   interference=host_interference(truth))
    return cluster, times.timed_trace()


def truth_profile() -> Profile:
    return Profile(name="truth", compute=TRUE_COMPUTE, links={"loopback": TRUE_LINK})


@pytest.mark.parametrize("world", [2, 4])
def test_link_figures_are_recovered_within_one_percent(world):
    cluster, trace = synthesized(world, truth_profile())
    profile, report = fit_profile([trace], cluster, base=default_profile(cluster.accelerator))
    fitted = profile.links["loopback"]
    assert fitted.bandwidth_Bps == pytest.approx(TRUE_LINK.bandwidth_Bps, rel=0.01)
    assert fitted.latency_s == pytest.approx(TRUE_LINK.latency_s, rel=0.01)
    assert fitted.call_s == pytest.approx(TRUE_LINK.call_s, rel=0.01)
    (estimate,) = report.links.links
    lo, hi = estimate.latency_ci_s  # exact data: an interval of (almost) no width around it
    assert lo * (1 - 1e-9) <= TRUE_LINK.latency_s <= hi * (1 + 1e-9)
    assert report.links.rms_error < 1e-6
    # Every op kind was fitted with what gloo runs (the reduce-scatter as an all-reduce).
    assert set(report.links.algorithms.values()) == {"gloo", "p2p"}


def test_compute_parameters_are_recovered_within_one_percent():
    cluster, trace = synthesized(2, truth_profile())
    profile, report = fit_profile([trace], cluster, base=default_profile(cluster.accelerator))
    acc = cluster.accelerator
    fitted_acc = profile.applied_to(cluster).accelerator
    model = ComputeModel(fitted_acc, profile)
    # Achieved rates are what is measurable: peak x efficiency, on either set of roofs.
    gemm = fitted_acc.peak_flops * (profile.kernel("fc1").flops_efficiency or 0)
    assert gemm == pytest.approx(acc.peak_flops * 0.6, rel=0.01)
    flash = fitted_acc.peak_flops * (profile.kernel("flash_attn").flops_efficiency or 0)
    assert flash == pytest.approx(acc.peak_flops * 0.3, rel=0.01)
    gelu = fitted_acc.hbm_bandwidth_Bps * (profile.kernel("gelu").memory_efficiency or 0)
    assert gelu == pytest.approx(acc.hbm_bandwidth_Bps * 0.25, rel=0.01)
    ln2 = fitted_acc.hbm_bandwidth_Bps * (profile.kernel("ln2").memory_efficiency or 0)
    assert ln2 == pytest.approx(acc.hbm_bandwidth_Bps * 0.4, rel=0.01)
    assert profile.compute.roofline_exponent == pytest.approx(3.0, rel=0.01)
    assert profile.kernel("ln1").overhead_s == pytest.approx(5e-5, rel=0.01)
    assert profile.kernel("optimizer").overhead_s == pytest.approx(2e-4, rel=0.01)
    assert profile.kernel("qkv").overhead_s == pytest.approx(3e-5, rel=0.01)
    # And so the fitted model times every kernel of the plan as the true one did.
    truth = ComputeModel(truth_profile().applied_to(cluster).accelerator, truth_profile())
    for op in trace.ops[0]:
        if op.kind is OpKind.COMPUTE and op.name != "":
            assert model.kernel_time(op.name, op.flops, op.mem_bytes, op.gemm,
                                     backward=op.phase == "bwd") == pytest.approx(
                truth.kernel_time(op.name, op.flops, op.mem_bytes, op.gemm,
                                  backward=op.phase == "bwd"), rel=0.01)
    assert report.compute.rms_error < 1e-6


def test_data_sheet_roofs_stay_and_efficiencies_are_recovered_directly():
    """On an accelerator with data-sheet roofs (here the H100's), the fit writes efficiencies
    against them and no measured roofs."""
    h100 = build_cluster("dgx-h100").accelerator
    truth = Profile(name="truth", compute=ComputeParams(
        gemm_efficiency=0.7, gemm_tiles=((8, 8),), memory_efficiency=0.8,
        launch_overhead_s=3e-6, roofline_exponent=2.0), links={"loopback": TRUE_LINK})
    host = build_cluster("localhost", gpus_per_node=2)
    cluster = Cluster(name=host.name, source=host.source, devices=host.devices, accelerator=h100,
                      devices_per_server=host.devices_per_server, fabric=host.fabric)
    spec = BenchSpec(world=2, sizes=(4096, 2**20), repeats=1, probes=PROBES)
    times = replay(bench_plan(spec), with_links(cluster, {"loopback": (1.3e9, 7e-6)}),
                   ComputeModel(h100, truth), interference=host_interference(truth))
    profile, _ = fit_profile([times.timed_trace()], cluster,
                             base=Profile(name="b", compute=ComputeParams(
                                 gemm_efficiency=0.5, gemm_tiles=((8, 8),))))
    assert profile.accelerator is None
    assert profile.kernel("fc2").flops_efficiency == pytest.approx(0.7, rel=0.01)
    assert profile.compute.gemm_efficiency == pytest.approx(0.7, rel=0.01)


def test_observed_durations_are_the_simulated_ones():
    """A collective lasts from its last member's arrival; a transfer from both sides' issue."""
    cluster, trace = synthesized(2, truth_profile())
    comm, compute = observe(trace)
    true_cluster = truth_profile().applied_to(cluster)
    collectives = Collectives(true_cluster)
    for s in comm:
        lowering = collectives.p2p(*s.group) if s.kind is OpKind.SEND else \
            collectives.resolve(s.kind, s.group, s.size_bytes)[1]
        assert s.seconds == pytest.approx(analytic_time(true_cluster, lowering, s.size_bytes),
                                          rel=1e-9)
    kernels = [op for op in trace.ops[0] + trace.ops[1]
               if op.kind is OpKind.COMPUTE and op.name in KERNEL_NAMES]
    assert len(compute) == len(kernels)  # the GEMMs between calls are not the plan's kernels


def test_gemm_work_is_the_compute_models_tile_count():
    acc = build_cluster("dgx-a100").accelerator
    model = ComputeModel(acc, default_profile(acc))
    tiles = model.profile.compute.gemm_tiles
    for gemm in [(1, 4096, 4096, 4096), (1, 2048, 109 * 128, 512), (8, 128, 128, 64)]:
        for backward in (False, True):
            per_unit = acc.sustained_flops * model.profile.compute.gemm_efficiency
            expected = sum(model.gemm_time(s, model.profile.compute.gemm_efficiency)
                           for s in ([(gemm[0], gemm[1], gemm[3], gemm[2]),
                                      (gemm[0], gemm[3], gemm[2], gemm[1])] if backward
                                     else [gemm]))
            assert gemm_work(gemm, backward, tiles, acc.compute_units) / per_unit == \
                pytest.approx(expected, rel=1e-12)


# --- the pieces ------------------------------------------------------------------------------

def test_gloo_lowering_on_localhost_matches_what_gloo_runs():
    """Reduce-scatter is an all-reduce of the whole buffer under gloo; 4 ranks run a ring
    (2(n-1) steps), not the halving/doubling the alpha-beta choice would take."""
    cluster = with_links(build_cluster("localhost", gpus_per_node=4), {"loopback": (1e9, 1e-5)})
    c = Collectives(cluster)
    group, size = (0, 1, 2, 3), 2**20
    name_rs, rs = c.resolve(OpKind.REDUCE_SCATTER, group, size)
    name_ar, ar = c.resolve(OpKind.ALL_REDUCE, group, size)
    assert name_rs == name_ar == "gloo"
    assert analytic_time(cluster, rs, size) == analytic_time(cluster, ar, size)
    # ring all-reduce: 2(n-1) hops of two 10 us links, 2(n-1)/n of the bytes at 1 GB/s
    assert analytic_time(cluster, ar, size) == pytest.approx(2 * 3 * 2e-5 + 1.5 * size / 1e9)
    # A per-call cost is paid once per collective, not per send.
    costly = with_links(cluster, {}, calls={"loopback": 3e-4})
    c2 = Collectives(costly)
    assert analytic_time(costly, c2.resolve(OpKind.ALL_REDUCE, group, size)[1], size) == \
        pytest.approx(3e-4 + 2 * 3 * 2e-5 + 1.5 * size / 1e9)
    assert analytic_time(costly, c2.p2p(0, 1), size) == pytest.approx(2e-5 + size / 1e9)
    assert c.resolve(OpKind.ALL_GATHER, group, size)[0] == "gloo"
    # On an NVSwitch server nothing changes.
    assert c.lowering(OpKind.ALL_REDUCE, group, "gloo") is not None
    assert Collectives(build_cluster("dgx-h100")).lowering(OpKind.ALL_REDUCE, group,
                                                           "gloo") is None


def test_with_links_replaces_only_the_named_class():
    cluster = build_cluster("dgx-h100", nodes=2)
    changed = with_links(cluster, {"nvlink": (1e11, 1e-6), "loopback": (1e9, 1e-5)})
    before, after = link_figures(cluster), link_figures(changed)
    assert after["nvlink"] == (1e11, 1e-6)
    assert {k: v for k, v in after.items() if k != "nvlink"} == \
        {k: v for k, v in before.items() if k != "nvlink"}
    assert link_figures(cluster) == before  # the original is a value, untouched


TINY = {"model": {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32, "vocab": 128,
                  "dtype": "fp32"},
        "parallel": {"dp": 2, "micro_batch": 1, "global_batch": 4},
        "cluster": {"preset": "localhost", "gpus_per_node": 2}}


def test_a_profile_sets_the_clusters_links_and_roofs_for_simulate(tmp_path):
    compute = ComputeParams(gemm_efficiency=0.5, gemm_tiles=((8, 8),))
    slow = Profile(name="slow", compute=compute, calibrated=True, measured_on="CPU-localhost",
                   links={"loopback": LinkParams(bandwidth_Bps=1e8, latency_s=1e-3)},
                   accelerator=AcceleratorRoofs(peak_flops=2e10, hbm_bandwidth_Bps=5e9))
    path = tmp_path / "slow.json"
    slow.save(path)
    assert load_profile(path) == slow
    exp = experiment_from_dict({**TINY, "sim": {"profile": str(path)}})
    assert link_figures(exp.cluster)["loopback"] == (1e8, 1e-3)
    assert exp.cluster.accelerator.peak_flops == 2e10
    base = experiment_from_dict(TINY)
    assert predict(exp)[0].step_time_s > predict(base)[0].step_time_s
    data = slow.to_json()
    del data["accelerator"]["peak_flops"]
    with pytest.raises(Exception, match="accelerator.peak_flops: missing"):
        profile_from_json(data)


def test_the_fitted_profile_is_a_valid_version_2_file(tmp_path):
    cluster, trace = synthesized(2, truth_profile())
    profile, _ = fit_profile([trace], cluster, base=default_profile(cluster.accelerator),
                             name="here")
    path = tmp_path / "here.json"
    profile.save(path)
    back = load_profile(path)
    assert back == profile and back.calibrated and back.name == "here"
    assert profile.to_json()["version"] == 2
    assert all(math.isfinite(v) for v in (back.links["loopback"].bandwidth_Bps,
                                          back.links["loopback"].latency_s))


# --- figures the data do not pin down -----------------------------------------------------------

def test_a_rate_the_data_never_feel_keeps_the_base_value_and_says_why():
    """fc1 takes 0.1 ms at every shape: all overhead, its rate left free (the fit drives it
    towards the search's bound, where the data no longer feel it)."""
    from sim.calibrate.kernels import fit_compute
    from sim.calibrate.observe import ComputeSample

    acc = build_cluster("localhost", gpus_per_node=2).accelerator
    samples = [ComputeSample("fc1", False, 2.0 * m * 64 * 64, 4.0 * m * 64, (1, m, 64, 64),
                             1e-4) for m in (8, 16, 32, 64, 128)]
    samples += [ComputeSample("gelu", False, 0.0, b, (), 1e-5 + b / 4e9)
                for b in (1e4, 1e5, 1e6, 1e7)]
    base = default_profile(acc)
    free = next(k for k in fit_compute(samples, acc, ((8, 8),)).kernels if k.name == "fc1")
    # Left alone, the fit sends it off towards its bound, where the data no longer feel it:
    # the largest probe's 2·128·64·64 FLOPs would take under 1% of its 0.1 ms (how far the
    # optimizer goes before it stops depends on scipy's version: 5.8e14 with 1.17).
    assert free.flops_rate > 2 * 128 * 64 * 64 / (0.01 * 1e-4)
    assert free.rate_unidentified is not None
    fit = fit_compute(samples, acc, ((8, 8),), base)
    fc1 = next(k for k in fit.kernels if k.name == "fc1")
    gelu = next(k for k in fit.kernels if k.name == "gelu")
    assert fc1.rate_unidentified is not None and fc1.overhead_unidentified is None
    # Held at the base's rate (its efficiency on the CPU's default roof), the rest refitted.
    assert fc1.flops_rate == pytest.approx(base.compute.gemm_efficiency * acc.peak_flops)
    assert gelu.identified and gelu.memory_rate == pytest.approx(4e9, rel=1e-3)
    cluster = build_cluster("localhost", gpus_per_node=2)
    from sim.calibrate.fit import _compute_params

    notes: list[str] = []
    roofs, params, count = _compute_params(fit, acc, base, notes)
    assert count > 0
    # The base's rate, relative to the roofs (the FLOP roof is the default's: none measured).
    assert params.kernels["fc1"].flops_efficiency == pytest.approx(
        base.compute.gemm_efficiency)
    assert params.gemm_efficiency == base.compute.gemm_efficiency
    assert roofs is not None and roofs.peak_flops == acc.peak_flops  # no FLOP roof measured
    assert any(n.startswith("kernel fc1 FLOP rate not identifiable: ") and
               n.endswith("kept the base profile's value") for n in notes)
    assert cluster.accelerator == acc


def test_too_few_shapes_keep_every_compute_figure_of_the_base(capsys):
    """One probe shape: two points per kernel (forward, backward) for its rate and overhead."""
    cluster = build_cluster("localhost", gpus_per_node=2)
    spec = BenchSpec(world=2, sizes=sweep_sizes(4096, 2**20, 4), repeats=1,
                     probes=probe_grid("fp32", hidden=(64,), seq_len=(32,), micro_batch=(1,),
                                       microbatches=1))
    truth = truth_profile()
    true_cluster = truth.applied_to(cluster)
    trace = replay(bench_plan(spec), true_cluster, ComputeModel(true_cluster.accelerator, truth),
                   interference=host_interference(truth)).timed_trace()
    base = default_profile(cluster.accelerator)
    profile, report = fit_profile([trace], cluster, base=base)
    assert profile.compute.kernels == {
        name: KernelCost() for name in profile.compute.kernels}  # nothing fitted per kernel
    assert profile.compute.roofline_exponent == base.compute.roofline_exponent
    assert profile.compute.launch_overhead_s == base.compute.launch_overhead_s
    assert profile.accelerator is None  # no roof measured
    assert any("distinct shapes measured for" in n or "of fc1 measured for its 2 parameters"
               in n for n in report.unidentified)
    # The links are pinned down: fitted as before.
    assert profile.links["loopback"].bandwidth_Bps == pytest.approx(1.3e9, rel=0.01)


def test_nothing_identifiable_is_one_error_line():
    from traces.errors import ConfigError

    cluster = build_cluster("localhost", gpus_per_node=2)
    spec = BenchSpec(world=1, probes=probe_grid("fp32", hidden=(64,), seq_len=(32,),
                                                micro_batch=(1,), microbatches=1))
    truth = truth_profile()
    true_cluster = truth.applied_to(cluster)
    trace = replay(bench_plan(spec), true_cluster, ComputeModel(true_cluster.accelerator, truth),
                   interference=host_interference(truth)).timed_trace()
    with pytest.raises(ConfigError, match="the traces pin down no figure"):
        fit_profile([trace], cluster, base=default_profile(cluster.accelerator))


# --- comm_interference ------------------------------------------------------------------------

@pytest.mark.parametrize(("interference", "slow_comm", "wait"),
                         [(0.0, 0.0, 0.0), (0.35, 1.2, 4e-3), (1.7, 0.4, 0.0), (0.5, 0.0, 2e-3)])
def test_both_interferences_are_recovered_from_the_interference_section(interference,
                                                                       slow_comm, wait):
    """Traces the simulator synthesized with known comm_interference (kernels beside data),
    compute_interference (data beside kernels) and its delay give all three back."""
    import dataclasses

    from sim.calibrate.interference import fit_interference
    from traces.bench import (
        INTERFERENCE_ALONE,
        INTERFERENCE_CHAIN,
        INTERFERENCE_COLLECTIVE,
        INTERFERENCE_COLLECTIVE_ALONE,
        INTERFERENCE_OVERLAPPED,
        INTERFERENCE_REPEATS,
        INTERFERENCE_SMALL_CALLS,
        INTERFERENCE_SMALL_CHAIN,
    )

    truth = dataclasses.replace(truth_profile(), compute=dataclasses.replace(
        TRUE_COMPUTE, comm_interference=interference, compute_interference=slow_comm,
        compute_interference_delay_s=wait))
    # a probe of ~1 ms at the true rate: shorter than the collective, the chain longer
    cluster, trace = synthesized(2, truth, interference_gemm=(256, 256, 256))
    names = [op.name for op in trace.ops[0]]
    calls = INTERFERENCE_REPEATS * (1 + INTERFERENCE_SMALL_CALLS)
    assert names.count(INTERFERENCE_ALONE) == INTERFERENCE_REPEATS
    assert names.count(INTERFERENCE_OVERLAPPED) == INTERFERENCE_REPEATS * (
        INTERFERENCE_CHAIN + INTERFERENCE_SMALL_CALLS * INTERFERENCE_SMALL_CHAIN)
    assert names.count(INTERFERENCE_COLLECTIVE) == calls
    assert names.count(INTERFERENCE_COLLECTIVE_ALONE) == calls
    kernels, comm, delay = fit_interference([trace], delay_s=0.25)  # a base it must not keep
    assert kernels is not None and kernels.unidentified is None
    assert kernels.num_overlapped > 2 and kernels.num_alone == 2 * INTERFERENCE_REPEATS
    assert kernels.value == pytest.approx(interference, rel=1e-6, abs=1e-9)
    assert kernels.ci[0] <= kernels.value <= kernels.ci[1]
    assert comm is not None and comm.unidentified is None and comm.num_outlived == 0
    assert comm.num_alone == comm.num_overlapped == calls
    assert comm.value == pytest.approx(slow_comm, rel=1e-6, abs=1e-9)
    assert delay is not None and delay.unidentified is None
    assert delay.value == pytest.approx(wait, rel=1e-6, abs=1e-9)
    base = default_profile(cluster.accelerator)  # the localhost default: rough figures
    profile, report = fit_profile([trace], cluster, base=base)
    assert profile.compute.comm_interference == pytest.approx(interference, rel=1e-6,
                                                              abs=1e-9)
    assert profile.compute.compute_interference == pytest.approx(slow_comm, rel=1e-6,
                                                                 abs=1e-9)
    assert profile.compute.compute_interference_delay_s == pytest.approx(wait, rel=1e-6,
                                                                         abs=1e-9)
    assert (report.interference, report.compute_interference,
            report.compute_interference_delay) == (kernels, comm, delay)


def test_one_collective_size_keeps_the_base_delay_and_fits_the_slowdown_beside_it():
    """Traces of an older bench (one collective size) cannot tell the wait from the slowdown:
    the delay is the base's, unidentified, and the slowdown is fitted beside it exactly."""
    import dataclasses

    from sim.calibrate.interference import fit_interference
    from traces.bench import INTERFERENCE_BYTES

    truth = dataclasses.replace(truth_profile(), compute=dataclasses.replace(
        TRUE_COMPUTE, compute_interference=0.8, compute_interference_delay_s=3e-3))
    cluster, trace = synthesized(2, truth, interference_gemm=(256, 256, 256))
    # keep the large size only (each collective with the chain after it)
    ops = {r: tuple(op for op in ops if not (op.kind.is_collective and op.name.startswith(
        "interference") and op.size_bytes != INTERFERENCE_BYTES)) for r, ops in
        trace.ops.items()}
    one = dataclasses.replace(trace, ops=ops)
    _, comm, delay = fit_interference([one], delay_s=3e-3)
    assert delay is not None and delay.unidentified is not None
    assert "one size" in delay.unidentified
    assert comm is not None and comm.value == pytest.approx(0.8, rel=1e-6)
    _, comm, _ = fit_interference([one], delay_s=0.0)  # all of it as slowdown
    assert comm is not None and comm.value > 0.8


def _probe_trace(alone: list[float], overlapped: list[float], collective_s: float = 1.0):
    """Rank 0's probes, each overlapped one inside a collective of `collective_s`."""
    from traces.bench import (
        INTERFERENCE_ALONE,
        INTERFERENCE_COLLECTIVE,
        INTERFERENCE_OVERLAPPED,
    )
    from traces.ops import Op, Stream, Trace
    from traces.purpose import Bench, BenchRole

    ops, t = [], 0.0
    for a, o in zip(alone, overlapped):
        ops.append(Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=INTERFERENCE_ALONE,
                      purpose=Bench(BenchRole.PROBE_ALONE), start=t, end=t + a))
        t += a
        ops.append(Op(kind=OpKind.ALL_REDUCE, stream=Stream.DP, name=INTERFERENCE_COLLECTIVE,
                      purpose=Bench(BenchRole.COLLECTIVE_BESIDE), group=(0,), size_bytes=8.0,
                      start=t, end=t + collective_s))
        ops.append(Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=INTERFERENCE_OVERLAPPED,
                      purpose=Bench(BenchRole.PROBE_OVERLAPPED), start=t + 1e-6,
                      end=t + 1e-6 + o))
        t += collective_s
    return Trace({0: tuple(ops)}, {})


def test_comm_interference_is_clamped_at_zero_and_needs_its_probes_inside_the_collective():
    from sim.calibrate.interference import fit_interference

    faster = fit_interference([_probe_trace([1e-3, 1.1e-3, 0.9e-3], [0.8e-3, 0.9e-3, 0.7e-3])])[0]
    assert faster is not None and faster.value == 0.0 and faster.ci[0] == 0.0
    noisy = fit_interference([_probe_trace([1e-3, 5e-3, 1e-3], [1e-3, 9e-3, 1e-3])])[0]
    assert noisy is not None and noisy.unidentified is not None and "interval" in \
        noisy.unidentified
    outlived = fit_interference([_probe_trace([1e-3] * 3, [2e-3] * 3, collective_s=1.5e-3)])[0]
    assert outlived is not None and outlived.num_outlived == 3
    assert outlived.unidentified is not None and "not wholly beside" in outlived.unidentified
    assert fit_interference([_probe_trace([], [])]) == (None, None, None)


def test_a_bandwidth_at_its_bound_keeps_the_clusters_and_the_rest_is_fitted_beside_it():
    """Links so fast that no size measured feels the bandwidth: it runs to the search's 100 TB/s
    bound, so the cluster's figure is kept, and latency and call cost are fitted again with it
    in place (they absorb what little the kept bandwidth adds)."""
    import dataclasses

    fast = dataclasses.replace(TRUE_LINK, bandwidth_Bps=1e14)
    truth = dataclasses.replace(truth_profile(), links={"loopback": fast})
    cluster, trace = synthesized(2, truth)
    preset_bw, _ = link_figures(cluster)["loopback"]
    profile, report = fit_profile([trace], cluster, base=default_profile(cluster.accelerator))
    link = profile.links["loopback"]
    assert link.bandwidth_Bps == preset_bw
    assert any(n.startswith("link loopback bandwidth not identifiable: at the upper bound")
               for n in report.unidentified)
    (estimate,) = report.links.links
    assert estimate.bandwidth_Bps == pytest.approx(preset_bw, rel=1e-12)
    assert estimate.call_unidentified is None
    assert link.call_s == pytest.approx(TRUE_LINK.call_s, rel=0.1)


STEP = """
[model]
layers = 2
hidden = 256
heads = 8
seq_len = 128
vocab = 1024

[parallel]
tp = 2
micro_batch = {mb}
global_batch = 4

[cluster]
preset = "dgx-h100"
gpus_per_node = 2
"""


def test_figures_held_at_the_base_leave_the_others_to_converge_on_the_truth():
    """Steps at micro batch 1 and 2 simulated with the preset's profile, fitted back with
    that profile as the base: the optimizer's, grad_norm's and grad_clip's one shape each
    leave their figures to the base (the truth here), and the others, fitted again beside
    them, come back to the truth (exactly, but for the optimizer's tolerances). Held by a
    bound pair 1e-10 wide, the held figures cut every step of the second solve short: it
    stopped at its 2000-step cap with flash attention's efficiency 15% high, 0.636."""
    import tomllib

    traces = []
    for mb in (1, 2):
        exp = experiment_from_dict(tomllib.loads(STEP.format(mb=mb)))
        traces.append(predict(exp, fold=False)[1].timed_trace())
    truth = exp.profile.compute
    profile, report = fit_profile(traces, exp.cluster,
                                  base=default_profile(exp.cluster.accelerator))
    assert {n.split(" ")[1] for n in report.unidentified if n.startswith("kernel ")} == {
        "grad_clip", "grad_norm", "optimizer"}
    fitted = profile.compute
    assert fitted.roofline_exponent == pytest.approx(truth.roofline_exponent, rel=1e-6)
    assert fitted.memory_efficiency == pytest.approx(truth.memory_efficiency, rel=1e-6)
    assert fitted.gemm_efficiency == pytest.approx(truth.gemm_efficiency, rel=1e-6)
    assert fitted.launch_overhead_s == pytest.approx(truth.launch_overhead_s, rel=1e-6)
    assert fitted.kernels["flash_attn"].flops_efficiency == pytest.approx(
        truth.kernels["flash_attn"].flops_efficiency, rel=1e-6)
