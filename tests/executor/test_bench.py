"""`parasim calibrate --run`: the microbenchmarks for real on 2 gloo ranks (4 KiB to 1 MiB, a
few GEMM shapes), through the executor, into a valid calibrated profile."""

from __future__ import annotations

import dataclasses
import json

import pytest

from executor.consistency import problems
from executor.recorder import load_run
from sim.cli import main
from sim.profile import KERNEL_NAMES, load_profile
from traces.bench import BenchSpec, bench_plan, probe_grid, sections
from traces.ops import OpKind

SIZES = "4K:1M"  # doubling: 9 sizes
PROBES = "64x32x1,64x64x2"
REPEATS = 2


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("calibrate")
    out, keep = tmp / "here.json", tmp / "bench"
    code = main(["calibrate", "--run", "localhost", "--ranks", "2", "--sizes", SIZES,
                 "--probes", PROBES, "--repeats", str(REPEATS), "--keep", str(keep),
                 "-o", str(out), "--json", "--timeout", "120"])
    return code, out, keep


def test_the_profile_is_valid_and_calibrated(calibrated, capsys):
    code, out, _ = calibrated
    assert code == 0, capsys.readouterr().err
    profile = load_profile(out)
    assert profile.calibrated and profile.to_json()["version"] == 2
    link = profile.links["loopback"]
    assert 1e6 <= link.bandwidth_Bps <= 1e14 and 0 <= link.latency_s <= 1
    assert profile.accelerator is not None  # the CPU's roofs are measured, not a data sheet's
    plan_kernels = {op.name for op in bench_plan(BenchSpec(
        world=1, probes=probe_grid("fp32", hidden=(64,), seq_len=(32,),
                                   micro_batch=(1,)))).ops[0]}
    assert plan_kernels <= set(profile.compute.kernels) <= set(KERNEL_NAMES)


def test_every_op_of_the_microbenchmarks_was_recorded_consistently(calibrated):
    code, _, keep = calibrated
    assert code == 0
    trace = load_run(keep)
    assert trace.timed and trace.meta["complete"] is True
    assert problems(trace) == []
    kinds = [s["kind"] for s in sections(trace)]
    assert kinds == ["collectives"] + ["probe"] * 4  # 2 probes, 2 passes
    # 3 collectives x 9 sizes x repeats per rank, and a ping-pong of 2 transfers per repeat
    ops0 = trace.ops[0]
    assert sum(op.kind.is_collective for op in ops0) == 3 * 9 * REPEATS
    assert sum(op.kind is OpKind.SEND for op in ops0) == 9 * REPEATS
    assert sum(op.kind is OpKind.RECV for op in ops0) == 9 * REPEATS


def test_the_fit_saw_every_measurement(calibrated, capsys):
    code, out, keep = calibrated
    assert code == 0
    # The same fit from the kept folder (DIR mode) reports what it used.
    refit = out.with_name("refit.json")
    assert main(["calibrate", str(keep), "-o", str(refit), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    trace = load_run(keep)
    meetings = 3 * 9 * REPEATS + 2 * 9 * REPEATS  # one sample per call and per transfer
    assert summary["samples"]["communication"] == meetings
    kernels = sum(op.kind is OpKind.COMPUTE and op.name in KERNEL_NAMES
                  for ops in trace.ops.values() for op in ops)
    assert summary["samples"]["compute"] == kernels
    assert load_profile(refit) == dataclasses.replace(load_profile(out), name="refit")
