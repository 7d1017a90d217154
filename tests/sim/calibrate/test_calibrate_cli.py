"""`parasim calibrate DIR...` and the one-line refusals of calibrate and validate: bad input is
one error line, exit 2, and no output file left behind."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sim.cli import main
from sim.engine.replay import replay
from sim.models.compute import ComputeModel
from sim.models.interference import host_interference
from sim.profile import ComputeParams, LinkParams, Profile, load_profile
from topology import build_cluster
from traces.bench import BenchSpec, bench_plan, probe_grid
from traces.errors import ConfigError
from traces.io import save
from traces.ops import Op, OpKind, Trace

TRUTH = Profile(name="truth", compute=ComputeParams(gemm_efficiency=0.5, gemm_tiles=((8, 8),),
                                                    launch_overhead_s=2e-5),
                links={"loopback": LinkParams(bandwidth_Bps=2e9, latency_s=1e-5)})


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A folder like `parasim run --out`'s: rank<r>.json, here timed by the simulator."""
    cluster = TRUTH.applied_to(build_cluster("localhost", gpus_per_node=2))
    spec = BenchSpec(world=2, sizes=(4096, 65536, 2**20), repeats=1,
                     probes=probe_grid("fp32", hidden=(64,), seq_len=(32, 64),
                                       micro_batch=(1, 2), microbatches=1))
    trace = replay(bench_plan(spec), cluster, ComputeModel(cluster.accelerator, TRUTH),
                   interference=host_interference(TRUTH))
    timed = trace.timed_trace()
    folder = tmp_path_factory.mktemp("recorded")
    for rank in timed.ranks:
        save(type(timed)({rank: timed.ops[rank]}, timed.meta), folder / f"rank{rank}.json")
    return folder


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_fitting_a_folder_writes_a_calibrated_profile(recorded, tmp_path, capsys):
    out = tmp_path / "p.json"
    code, stdout, err = run_cli(capsys, "calibrate", recorded, "-o", out, "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    profile = load_profile(out)
    assert profile.calibrated and profile.name == "p"
    assert summary["profile"] == str(out.resolve())
    (link,) = summary["links"]
    assert link["kind"] == "loopback"
    assert link["bandwidth_Bps"] == pytest.approx(2e9, rel=1e-6)
    assert link["latency_s"] == pytest.approx(1e-5, rel=1e-6)
    assert summary["samples"]["communication"] > 0 and summary["compute"]["kernels"]
    # Provenance: the profile written, and the traces' bytes with the flags that chose them.
    assert summary["parasim"]["profile"] == {"name": "p", "calibrated": True}
    digest = summary["parasim"]["config_sha256"]
    code, again, _ = run_cli(capsys, "calibrate", recorded, "-o", out, "--json")
    assert json.loads(again)["parasim"]["config_sha256"] == digest
    code, other, _ = run_cli(capsys, "calibrate", recorded, "-o", out, "--json",
                             "--cluster", "localhost")
    assert json.loads(other)["parasim"]["config_sha256"] != digest
    code, text, _ = run_cli(capsys, "calibrate", recorded, "-o", out)
    assert code == 0 and "link loopback" in text and "profile written" in text


def bad_folder(tmp_path, text: str):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "rank0.json").write_text(text)
    return folder


@pytest.mark.parametrize(("content", "message"), [
    ('{"schema": "parasim.trace", "version": 2, "meta": {}, "ranks": {"0": [', "not a JSON"),
    ('{"schema": "parasim.trace", "version": 99, "meta": {}, "ranks": {}}', "version"),
    ('{"schema": "parasim.trace", "version": 2, "meta": {}, "ranks": {"0": [{"kind": '
     '"send", "stream": "p2p", "size_bytes": 8}]}}', "peer"),
    ('{"schema": "parasim.trace", "version": 2, "meta": {}, "ranks": {"0": [{"kind": '
     '"compute", "stream": "compute", "name": "fc1"}]}}', "no timed ops"),
])
def test_bad_traces_are_one_line_and_leave_no_profile(tmp_path, capsys, content, message):
    out = tmp_path / "p.json"
    code, stdout, err = run_cli(capsys, "calibrate", bad_folder(tmp_path, content), "-o", out)
    assert code == 2 and stdout == ""
    assert err.count("\n") == 1 and err.startswith("parasim: error:") and message in err
    assert not out.exists()


@pytest.mark.parametrize(("flags", "message"), [
    ([], "give trace folders to fit, or --run"),
    (["--run", "dgx-z100"], "neither a preset"),
    (["--run", "localhost", "--ranks", "1"], "--ranks: 1 must be from 2"),
    (["--run", "localhost", "--probes", "64x32"], "not HIDDENxSEQxBATCH"),
    (["--run", "localhost", "--repeats", "0"], "--repeats: 0"),
    (["--run", "localhost", "--sizes", "1M:1K"], "starts above its end"),
    (["--run", "localhost", "--cluster", "localhost"], "the --run target's"),
])
def test_bad_flags_are_one_line_before_anything_runs(tmp_path, capsys, flags, message):
    out = tmp_path / "p.json"
    code, _, err = run_cli(capsys, "calibrate", "-o", out, *flags)
    assert code == 2 and err.count("\n") == 1 and message in err
    assert not out.exists()


def test_the_profile_may_not_overwrite_a_trace_or_be_a_directory(recorded, tmp_path, capsys):
    code, _, err = run_cli(capsys, "calibrate", recorded, "-o", recorded / "rank0.json")
    assert code == 2 and "is an input of this run" in err
    code, _, err = run_cli(capsys, "calibrate", recorded, "-o", tmp_path)
    assert code == 2 and "is a directory" in err


PROFILE_V1 = {"schema": "parasim.profile", "version": 1, "name": "old",
              "compute": {"gemm_efficiency": 0.5}}


@pytest.mark.parametrize(("content", "message"), [
    (json.dumps(PROFILE_V1), "version-1 profile"),
    (json.dumps({**PROFILE_V1, "version": 7}), "has version 7"),
    ('{"schema": "parasim.profile", "version": 2, "name": "x", "comp', "not a JSON"),
])
def test_validate_refuses_a_bad_profile_before_running(tmp_path, capsys, content, message):
    pytest.importorskip("torch")  # without it validate refuses first, for that reason
    profile = tmp_path / "p.json"
    profile.write_text(content)
    report = tmp_path / "v.html"
    code, stdout, err = run_cli(capsys, "validate", "--profile", profile, "--report", report)
    assert code == 2 and stdout == "" and err.count("\n") == 1 and message in err
    assert not report.exists()


def test_validate_refuses_bad_flags(tmp_path, capsys):
    pytest.importorskip("torch")  # without it validate refuses first, for that reason
    code, _, err = run_cli(capsys, "validate", "--steps", "0")
    assert code == 2 and "--steps: 0" in err
    code, _, err = run_cli(capsys, "validate", "--report", tmp_path / "no" / "v.html")
    assert code == 2 and "does not exist" in err


# --- profiles belong to the accelerator they were measured on ---------------------------------

def test_run_refuses_a_gpu_cluster_on_a_host_without_its_gpus(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA GPUs")
    out = tmp_path / "a100.json"
    code, stdout, err = run_cli(capsys, "calibrate", "--run", "dgx-a100", "-o", out)
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert "A100-SXM4-80GB GPUs and this host has 0 CUDA GPUs" in err
    assert not out.exists()
    code, _, err = run_cli(capsys, "calibrate", "--run", "tpu-v4", "-o", out)
    assert code == 2 and "CUDA GPUs or this host's CPU only" in err and not out.exists()


def test_run_needs_gpus_of_the_clusters_model(monkeypatch):
    torch = pytest.importorskip("torch")
    from sim.calibrate.microbench import host_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    with pytest.raises(ConfigError, match="this host's are NVIDIA H200"):
        host_backend(build_cluster("dgx-a100"), 2, "--run dgx-a100")
    assert host_backend(build_cluster("dgx-h200"), 2, "--run dgx-h200") == "nccl"
    with pytest.raises(ConfigError, match="its 4 ranks run on H200-SXM-141GB GPUs and this host "
                       "has 2 CUDA GPUs"):
        host_backend(build_cluster("dgx-h200"), 4, "--run dgx-h200")
    # localhost always runs on the CPU with gloo, whatever GPUs the host has.
    assert host_backend(build_cluster("localhost", gpus_per_node=2), 2, "--run localhost") \
        == "gloo"


def test_a_fitted_profile_says_what_it_was_measured_on(recorded, tmp_path, capsys):
    out = tmp_path / "here.json"
    assert run_cli(capsys, "calibrate", recorded, "-o", out)[0] == 0
    assert load_profile(out).measured_on == "CPU-localhost"
    assert json.loads(out.read_text())["measured_on"] == "CPU-localhost"
    # one file per rank: the ranks of them all (issue 22, item 17: validate compares them)
    assert load_profile(out).measured_ranks == 2


@pytest.mark.parametrize("command", ["simulate", "replay"])
def test_a_profile_of_one_accelerator_is_refused_on_another(recorded, tmp_path, capsys,
                                                            command):
    out = tmp_path / "here.json"
    assert run_cli(capsys, "calibrate", recorded, "-o", out)[0] == 0
    if command == "simulate":
        argv = ["simulate", "sim/examples/gpt3-175b-1024-a100.toml", "--profile", out, "--json"]
    else:
        argv = ["replay", recorded, "--cluster", "dgx-a100", "--profile", out, "--json"]
    code, stdout, err = run_cli(capsys, *argv)
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert "measured on CPU-localhost" in err and "A100-SXM4-80GB" in err
    assert "do not transfer between accelerators" in err


def test_a_calibrated_profile_that_does_not_say_its_accelerator_is_refused(tmp_path, capsys):
    old = tmp_path / "old.json"
    Profile(name="old", calibrated=True, compute=ComputeParams(gemm_efficiency=0.5)).save(old)
    code, _, err = run_cli(capsys, "simulate", "sim/examples/gpt3-175b-1024-a100.toml",
                           "--profile", old)
    assert code == 2 and "does not say which accelerator" in err


def test_traces_measured_on_a_cpu_are_not_fitted_as_a_gpu_cluster(recorded, tmp_path, capsys):
    from traces.io import load

    folder = tmp_path / "gloo"
    folder.mkdir()
    for rank in (0, 1):
        part = load(recorded / f"rank{rank}.json")
        save(type(part)(part.ops, dataclasses.replace(part.meta, backend="gloo")),
             folder / f"rank{rank}.json")
    out = tmp_path / "p.json"
    code, _, err = run_cli(capsys, "calibrate", folder, "--cluster", "dgx-a100", "-o", out)
    assert code == 2 and "measured on the CPU (gloo)" in err and not out.exists()


# --- PyTorch-profiler traces --------------------------------------------------------------------

KINETO = "tests/data/kineto/a100-2rank-nccl-rank0.json.gz"


def test_a_profiler_trace_fits_the_link_classes_its_collectives_cross(tmp_path, capsys):
    out = tmp_path / "a100.json"
    code, stdout, err = run_cli(capsys, "calibrate", KINETO, "--cluster", "dgx-a100", "-o", out,
                                "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert [e["kind"] for e in summary["links"]] == ["nvlink"]
    assert summary["samples"]["communication"] > 0 and summary["compute"] is None
    profile = load_profile(out)
    assert profile.measured_on == "A100-SXM4-80GB" and "nvlink" in profile.links
    # An NCCL trace is a GPU's: not fitted as this host's CPU.
    code, _, err = run_cli(capsys, "calibrate", KINETO, "-o", tmp_path / "cpu.json")
    assert code == 2 and "measured on GPUs (NCCL)" in err


def test_a_profiler_trace_with_nothing_to_fit_is_one_line(tmp_path, capsys):
    record = {"Collective name": "allreduce", "dtype": "Float", "Process Group Ranks": "[0, 1]"}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 40,
         "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 50,
         "dur": 30, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 51,
         "dur": 28, "args": record}]
    document = {"schemaVersion": 1, "traceEvents": events,
                "distributedInfo": {"rank": 0, "world_size": 2, "backend": "gloo"}}
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(document))
    out = tmp_path / "p.json"
    code, stdout, err = run_cli(capsys, "calibrate", path, "-o", out)
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert "a PyTorch-profiler trace with nothing to fit" in err and not out.exists()


def test_validate_refuses_a_gpu_config_on_a_host_without_its_gpus(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA GPUs")
    report = tmp_path / "v.html"
    code, stdout, err = run_cli(capsys, "validate", "sim/examples/llama-7b-zero3-64-h100.toml",
                                "--report", report)
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert "H100-SXM5-80GB GPUs and this host has 0 CUDA GPUs" in err and not report.exists()


def test_a_trace_of_one_memory_bound_class_fits_its_rate_and_overhead(tmp_path, capsys):
    """Only ln1 kernels (no GEMM, no random draws): a fit of its memory rate and overhead
    alone, t = overhead + bytes / rate, back to back on one stream. The common memory rate
    and the exponent mean nothing here (no kernel with FLOPs, no point where two terms
    meet): kept, and said so. On the CPU the rate is the measured memory roof."""
    rate, overhead, start = 4e9, 2e-5, 0.0
    ops = []
    for size in (1e4, 1e5, 1e6, 1e7) * 3:
        end = start + overhead + size / rate
        ops.append(Op(kind=OpKind.COMPUTE, stream="compute", name="ln1", mem_bytes=size,
                      start=start, end=end))
        start = end
    trace = tmp_path / "ln1" / "rank0.json"
    trace.parent.mkdir()
    save(Trace({0: tuple(ops)}), trace)
    out = tmp_path / "p.json"
    code, stdout, err = run_cli(capsys, "calibrate", trace.parent, "-o", out, "--json")
    assert code == 0, err
    profile = load_profile(out)
    assert profile.accelerator is not None
    assert profile.accelerator.hbm_bandwidth_Bps == pytest.approx(rate, rel=1e-9)
    assert profile.compute.kernels["ln1"].memory_efficiency == 1.0
    assert profile.compute.kernels["ln1"].overhead_s == pytest.approx(overhead, rel=1e-9)
    assert profile.compute.launch_overhead_s == pytest.approx(overhead, rel=1e-9)
    assert "compute memory rate not identifiable: no kernel with FLOPs measured" in err
    assert "roofline exponent not identifiable: no kernel measured with two of" in err
