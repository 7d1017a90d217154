"""`parasim whatif` (issue 34): a target equal to the capture is `replay`, one that only moves
the cluster is `replay --cluster`; a shape the capture ran keeps its measured median, a new
one is scaled or follows calibrate's fit and is flagged; bad input is one line, exit 2.

The captures here are simulated steps saved as traces (every op timed, as a run's are), so
the numbers they hold are known exactly; tests/sim/test_whatif_run.py uses a real gloo run.
"""

from __future__ import annotations

import json
import statistics
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from sim.cli import main
from sim.config import experiment_from_dict
from sim.models.host import plan_compute
from sim.profile import default_profile
from sim.settings import parse_settings
from sim.simulate import predict
from sim.whatif import load_captured, target_experiment, whatif
from sim.whatif.book import Source, Statistic, learn, load_factor, shape_key
from tests.sim.engine.test_replay_own_trace import moe_job
from topology.override import link_figures, with_links
from traces.io import save
from traces.ops import OpKind, Trace
from traces.plan import build

JOB = """
[model]
layers = 2
hidden = 256
heads = 8
seq_len = 128
vocab = 1024

[parallel]
tp = {tp}
dp = {dp}
micro_batch = {mb}
global_batch = 4

[cluster]
preset = "{preset}"
nodes = 1
gpus_per_node = 2
"""
KINETO = Path(__file__).parents[1] / "data" / "kineto" / "a100-2rank-nccl-rank0.json.gz"


def job(tp: int = 2, dp: int = 1, mb: int = 1, preset: str = "dgx-h100") -> str:
    return JOB.format(tp=tp, dp=dp, mb=mb, preset=preset)


def captured_step(text: str) -> Trace:
    _, times = predict(experiment_from_dict(tomllib.loads(text)), fold=False)
    return times.timed_trace()


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("whatif") / "tp2.json"
    save(captured_step(job()), path)
    return path


@pytest.fixture(scope="module")
def capture_dp(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("whatif") / "dp2.json"
    save(captured_step(job(tp=1, dp=2)), path)
    return path


def run_json(capsys, *argv) -> dict:
    code = main([str(a) for a in argv] + ["--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def refused(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("parasim: error: ")
    return err


def test_a_target_equal_to_the_capture_is_replay(capsys, capture):
    mine = run_json(capsys, "whatif", capture)
    theirs = run_json(capsys, "replay", capture)
    assert mine["step_time_predicted_s"] == theirs["step_time_predicted_s"]
    assert mine["step_time_range_s"] == [mine["step_time_predicted_s"]] * 2
    assert mine["compute_ops_by_source"] == {"own": theirs["kept_measured_compute"]}
    assert mine["extrapolated_kernels"] == {} and "qkv" in mine["measured_kernels"]


def test_a_target_on_another_cluster_is_replay_cluster(capsys, capture_dp, tmp_path):
    """A100 servers of one GPU each: the DP all-reduce crosses InfiniBand, not NVLink."""
    capture = capture_dp
    a100 = tmp_path / "a100.toml"
    a100.write_text('[cluster]\npreset = "dgx-a100"\nnodes = 2\nfabric = "rail"\n'
                    "gpus_per_node = 1\n")
    mine = run_json(capsys, "whatif", capture, "--set", "cluster.preset=dgx-a100",
                    "--set", "cluster.fabric=rail", "--set", "cluster.nodes=2",
                    "--set", "cluster.gpus_per_node=1")
    theirs = run_json(capsys, "replay", capture, "--cluster", a100)
    same = run_json(capsys, "replay", capture)
    assert mine["step_time_predicted_s"] == theirs["step_time_predicted_s"]
    assert mine["step_time_predicted_s"] != same["step_time_predicted_s"]  # it moved
    assert mine["cluster"] == theirs["cluster"]


def test_a_shape_the_capture_ran_keeps_its_median_and_a_new_one_is_scaled(capture):
    captured = load_captured([str(capture)])
    target = target_experiment(captured, settings=parse_settings(["parallel.tp=1",
                                                                  "parallel.dp=2"]))
    cluster = target.cluster
    book = learn(captured.traces, cluster, target.model, target.layout,
                 statistic=Statistic.MEDIAN)
    plan = build(target.model, target.layout)
    by_name = {(op.name, op.phase): op for op in plan.ops[0] if op.kind is OpKind.COMPUTE}
    ln1 = by_name["ln1", "fwd"]  # a norm over the full hidden: the same shape under TP or not
    seen = [op.end - op.start for ops in captured.first.ops.values() for op in ops
            if op.kind is OpKind.COMPUTE and shape_key(op) == shape_key(ln1)]
    timing = book.time(ln1)
    assert timing.source is Source.MEASURED and timing.seconds == statistics.median(seen)
    qkv = by_name["qkv", "fwd"]  # its GEMM unsharded: twice the capture's FLOPs
    near = next(op for op in book.shapes["qkv", False])
    model = plan_compute(cluster, target.profile, target.model, target.layout)
    timing = book.time(qkv)
    assert timing.source is Source.SCALED and timing.ratio == 2.0
    assert timing.seconds == pytest.approx(
        book.durations[shape_key(near)] * model.duration(qkv) / model.duration(near),
        rel=1e-12)
    assert 0 < timing.uncertainty <= 1


def test_the_cli_flags_each_extrapolated_kernel_with_its_ratio(capsys, capture):
    out = run_json(capsys, "whatif", capture, "--set", "parallel.tp=1", "--set",
                   "parallel.dp=2")
    assert "ln1" in out["measured_kernels"] and "qkv" not in out["measured_kernels"]
    qkv = out["extrapolated_kernels"]["qkv"]
    assert qkv["shape_ratio"] == 2.0 and set(qkv["ops"]) == {"scaled"}
    low, high = out["step_time_range_s"]
    assert low < out["step_time_predicted_s"] < high
    assert out["ranks_as_captured"] == 0


def test_a_new_shape_follows_the_fit_where_it_pins_the_class_down():
    """Two shapes of each class (micro batch 1 and 2) pin calibrate's fit down; at micro
    batch 4 it gives back the compute model the captures were timed by."""
    traces = [captured_step(job(mb=mb)) for mb in (1, 2)]
    target = experiment_from_dict(tomllib.loads(job(mb=4)))
    book = learn(traces, target.cluster, target.model, target.layout)
    model = plan_compute(target.cluster, target.profile, target.model, target.layout)
    plan = build(target.model, target.layout)
    qkv = next(op for op in plan.ops[0] if op.name == "qkv")
    timing = book.time(qkv)
    assert timing.source is Source.FITTED and timing.ratio == 2.0
    truth = model.duration(qkv)
    assert abs(timing.seconds - truth) <= timing.uncertainty * truth  # inside its error bar
    assert timing.uncertainty < 0.01


def test_traces_of_two_jobs_are_refused(capsys, capture, tmp_path):
    other = tmp_path / "mb2.json"
    save(captured_step(job(mb=2)), other)
    err = refused(capsys, "whatif", capture, other)
    assert "another job" in err


def test_a_trace_without_timed_kernels_is_refused(capsys, tmp_path):
    """The simulated step with its times taken away: a plan, which no run measured."""
    step = captured_step(job())
    plan = Trace({r: tuple(replace(op, start=None, end=None) for op in ops)
                  for r, ops in step.ops.items()}, replace(step.meta, timed=False))
    path = tmp_path / "plan.json"
    save(plan, path)
    assert "holds no timed kernels" in refused(capsys, "whatif", path)


def test_a_profiler_trace_needs_its_job_and_kernels_of_a_plan(capsys, tmp_path):
    assert "--job job.toml" in refused(capsys, "whatif", KINETO)
    toml = tmp_path / "job.toml"
    toml.write_text(job(tp=1, dp=2, preset="dgx-a100"))
    err = refused(capsys, "whatif", KINETO, "--job", toml)
    assert "holds no timed kernels" in err and "convolutions and batch norm: a CNN" in err
    toml.write_text(job(tp=2, dp=2, preset="dgx-a100").replace("gpus_per_node = 2",
                                                               "gpus_per_node = 4"))
    assert "its layout has 4 ranks" in refused(capsys, "whatif", KINETO, "--job", toml)


def test_the_eight_rank_a100_trace_is_named_a_recommendation_model(capsys, tmp_path):
    """Its kernels are fbgemm's `split_embedding_codegen_*` (TorchRec embedding tables) beside
    an MLP: no transformer, so the refusal says which family it is."""
    toml = tmp_path / "job.toml"
    toml.write_text(job(tp=1, dp=8, preset="dgx-a100").replace(
        "gpus_per_node = 2", "gpus_per_node = 8").replace("global_batch = 4", "global_batch = 8"))
    err = refused(capsys, "whatif", KINETO.with_name("a100-8rank-pp-rank3.json.gz"), "--job",
                  toml)
    assert "embedding-table lookups: a recommendation model" in err


def test_a_kernel_class_the_capture_never_ran_needs_a_profile(capsys, capture, tmp_path):
    swiglu = ["--set", "model.ffn=swiglu", "--set", "model.ffn_hidden=512"]
    err = refused(capsys, "whatif", capture, *swiglu)
    assert "never ran in the capture" in err and "--profile" in err
    profile = tmp_path / "h100.json"
    target = experiment_from_dict(tomllib.loads(job()))
    profile.write_text(json.dumps(default_profile(target.cluster.accelerator).to_json()))
    out = run_json(capsys, "whatif", capture, *swiglu, "--profile", profile)
    ops = 2 * 2 * 4 * 2  # ranks x layers x micro-batches x (forward, backward)
    assert out["extrapolated_kernels"]["swiglu"]["ops"] == {"profile": ops}
    assert out["extrapolated_kernels"]["swiglu"]["uncertainty"] == 1.0


def test_every_op_of_an_identical_target_keeps_its_own_time(capture):
    captured = load_captured([str(capture)])
    result = whatif(captured, target_experiment(captured))
    assert result.ranks_kept == result.ranks == 2
    assert result.times.plan.ops == captured.first.ops  # times and all


def test_a_larger_target_is_folded_and_keeps_the_measured_shapes(capsys, capture_dp):
    """DP 2 -> DP 64 over 32 servers, two micro-batches per rank as captured: the same
    per-rank shapes, so every kernel keeps its measured median and the range is a point;
    one rank stands for the whole world."""
    out = run_json(capsys, "whatif", capture_dp, "--set", "parallel.dp=64", "--set",
                   "parallel.global_batch=128", "--set", "cluster.nodes=32")
    assert out["ranks_simulated"] == 1 and out["ranks_as_captured"] == 0
    assert set(out["compute_ops_by_source"]) == {"measured"}
    assert out["extrapolated_kernels"] == {}
    assert out["step_time_range_s"] == [out["step_time_predicted_s"]] * 2


def test_the_mean_stands_for_a_shape_where_asked(capture):
    """--statistic mean: a measured shape's time is the mean of its captured times."""
    captured = load_captured([str(capture)])
    target = target_experiment(captured)
    op = next(op for op in captured.first.ops[0] if op.kind is OpKind.COMPUTE)
    seen = [o.end - o.start for ops in captured.first.ops.values() for o in ops
            if o.kind is OpKind.COMPUTE and shape_key(o) == shape_key(op)]
    book = learn(captured.traces, target.cluster, target.model, target.layout,
                 statistic=Statistic.MEAN)
    timing = book.time(replace(op, start=None, end=None))
    assert timing.source is Source.MEASURED and timing.seconds == statistics.fmean(seen)


def test_the_load_statistic_keeps_the_captured_total(capture):
    """The default: each shape's median times one load factor F, the measured total over the
    total of the shapes' medians; summed over the captured ops it is their measured sum."""
    captured = load_captured([str(capture)])
    target = target_experiment(captured)
    ops = [o for ops in captured.first.ops.values() for o in ops if o.kind is OpKind.COMPUTE]
    by_shape: dict[tuple[object, ...], list[float]] = {}
    for o in ops:
        by_shape.setdefault(shape_key(o), []).append(o.end - o.start)
    factor = sum(map(sum, by_shape.values())) / sum(
        statistics.median(v) * len(v) for v in by_shape.values())
    book = learn(captured.traces, target.cluster, target.model, target.layout)
    for key, seen in by_shape.items():
        assert book.durations[key] == statistics.median(seen) * factor
    predicted = sum(book.time(replace(o, start=None, end=None)).seconds for o in ops)
    assert predicted == pytest.approx(sum(o.end - o.start for o in ops), rel=1e-12)


def test_a_heavy_tailed_shape_costs_its_share_of_the_load():
    """Two shapes, one op of each preempted: F spreads the stolen time over the ops in
    proportion to their median, and the total stays the measured one."""
    durations = {("a",): [1.0, 1.0, 1.0, 5.0], ("b",): [2.0, 2.0, 2.0, 2.0]}
    assert load_factor(durations) == 16.0 / 12.0


def test_new_ops_communicate_at_the_capture_s_own_link_figures(tmp_path):
    """A capture whose loopback really costs milliseconds per call (as gloo does on a loaded
    host), its header naming plain `localhost` (tens of µs): a target with new ops times its
    all-reduce by the links fitted to the capture, so the same gradient all-reduce takes what
    it took when captured; the captured job itself is `replay`, on the cluster's figures.
    (A simulated step's own header marks it predicted: its links are the cluster's already.)"""
    exp = experiment_from_dict(tomllib.loads(job(tp=1, dp=2, preset="localhost")))
    slow = with_links(exp.cluster, {"loopback": (0.4e9, 2e-3)}, calls={"loopback": 2e-3})
    _, times = predict(replace(exp, cluster=slow), fold=False)
    timed = times.timed_trace()
    path_trace = Trace(timed.ops, replace(timed.meta, complete=True))  # a run's header
    save(path_trace, tmp_path / "slow.json")
    captured = load_captured([str(tmp_path / "slow.json")])
    longer = whatif(captured, target_experiment(captured, settings=parse_settings(
        ["model.seq_len=64"])), capture_links=True)
    assert longer.links is not None and longer.links.samples == 1
    # one message size pins nothing down: the cluster's latency and call cost stay, the bytes
    # take the rest (`sim.whatif.links`)
    bandwidth, latency, call = longer.links.figures["loopback"]
    assert (latency, call) == (link_figures(exp.cluster)["loopback"][1], 0.0)
    assert bandwidth < link_figures(exp.cluster)["loopback"][0]

    def all_reduce_s(starts: dict[int, list[float]], ends: dict[int, list[float]]) -> float:
        """From the last member's arrival to the end (when the simulator runs it)."""
        at = {r: next(i for i, op in enumerate(ops) if op.kind is OpKind.ALL_REDUCE)
              for r, ops in path_trace.ops.items()}
        assert all(ends[r][i] == ends[0][at[0]] for r, i in at.items())
        return ends[0][at[0]] - max(starts[r][i] for r, i in at.items())

    captured_s = all_reduce_s(times.starts, times.ends)
    assert captured_s > 4e-3  # the cluster's own figures: some tens of µs
    # within 1%: the compute beside it slows it a little differently at the new shapes
    assert all_reduce_s(longer.times.starts, longer.times.ends) == \
        pytest.approx(captured_s, rel=0.01)
    same = whatif(captured, target_experiment(captured), capture_links=True)
    assert same.links is None and same.ranks_kept == 2


def test_a_class_the_capture_never_ran_is_timed_as_simulate_times_it():
    """--profile's figures time a kernel class the capture never ran, by simulate's compute
    model (`sim.models.host.plan_compute`): FP8 current scaling under TE's GroupedLinear
    launches 8 quantize kernels per expert cast op (`device_launches`), which the book's
    model built from the stack's launch counts alone charged as one (4.2 us against
    simulate's 25.2). The capture: simulate's own step of the job, cut down to two classes;
    every other kernel no transfer overlapped (so simulate did not stretch it) takes the
    time simulate gave it."""
    exp = moe_job("fp8", "tensorwise")
    _, times = predict(exp)
    timed = times.timed_trace()
    ops = timed.ops[0]
    capture = Trace({0: tuple(replace(op, deps=()) for op in ops
                              if op.name in ("ln1", "qkv"))}, timed.meta)
    book = learn([capture], exp.cluster, exp.model, exp.layout, fallback=exp.profile)
    moving = [(op.start, op.end) for op in ops if op.kind is not OpKind.COMPUTE]
    alone = [op for op in ops if op.kind is OpKind.COMPUTE and op.name not in ("ln1", "qkv")
             and not any(s < op.end and op.start < e for s, e in moving)]
    assert {"expert_cast", "expert_fc1", "expert_fc2"} <= {op.name for op in alone}
    for op in alone:
        timing = book.time(replace(op, start=None, end=None))
        assert timing.source is Source.PROFILE
        assert timing.seconds == pytest.approx(op.end - op.start, rel=1e-9)
