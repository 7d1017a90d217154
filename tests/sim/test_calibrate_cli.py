"""`parasim calibrate DIR...` and the one-line refusals of calibrate and validate: bad input is
one error line, exit 2, and no output file left behind."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.compute import ComputeModel
from sim.profile import ComputeParams, LinkParams, Profile, load_profile
from sim.replay import replay
from topology import build_cluster
from traces.bench import BenchSpec, bench_plan, probe_grid
from traces.io import save

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
    trace = replay(bench_plan(spec), cluster, ComputeModel(cluster.accelerator, TRUTH))
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
    profile = tmp_path / "p.json"
    profile.write_text(content)
    report = tmp_path / "v.html"
    code, stdout, err = run_cli(capsys, "validate", "--profile", profile, "--report", report)
    assert code == 2 and stdout == "" and err.count("\n") == 1 and message in err
    assert not report.exists()


def test_validate_refuses_bad_flags(tmp_path, capsys):
    code, _, err = run_cli(capsys, "validate", "--steps", "0")
    assert code == 2 and "--steps: 0" in err
    code, _, err = run_cli(capsys, "validate", "--report", tmp_path / "no" / "v.html")
    assert code == 2 and "does not exist" in err
