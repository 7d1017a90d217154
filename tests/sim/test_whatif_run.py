"""`parasim whatif` on a real capture: two gloo ranks of the shipped tiny GPT (TP 2) recorded
by `parasim run`. The same job predicted from it is `replay` of it, to the last bit; the job
at DP 2 keeps the norms' measured medians (the same shape without TP) and scales the GEMMs
(twice the FLOPs per rank), with a range around the prediction.
"""

from __future__ import annotations

import json
import statistics

import pytest

pytest.importorskip("torch")  # the executor records the capture

from executor.probe import PROBE_BYTES, PROBE_CALLS
from sim.cli import main
from sim.config import example_path
from sim.settings import parse_settings
from sim.whatif import load_captured, target_experiment
from sim.whatif.book import Source, Statistic, learn, shape_key
from sim.whatif.links import probe_samples
from traces.ops import OpKind
from traces.plan import build

TWO_RANKS = example_path().parent / "gpt-tiny-2rank-localhost.toml"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("whatif-run") / "tp2"
    assert main(["run", str(TWO_RANKS), "--out", str(out)]) == 0
    return out


def run_json(capsys, *argv) -> dict:
    code = main([str(a) for a in argv] + ["--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_the_captured_job_is_replay_of_the_run(capsys, run_dir):
    mine = run_json(capsys, "whatif", run_dir)
    theirs = run_json(capsys, "replay", run_dir)
    assert mine["step_time_predicted_s"] == theirs["step_time_predicted_s"]
    assert mine["step_time_captured_s"] == theirs["step_time_measured_s"]
    assert mine["compute_ops_by_source"] == {"own": theirs["kept_measured_compute"]}


def test_dp2_keeps_the_norms_medians_and_scales_the_gemms(capsys, run_dir):
    out = run_json(capsys, "whatif", run_dir, "--set", "parallel.tp=1", "--set",
                   "parallel.dp=2")
    assert {"ln1", "ln2"} <= set(out["measured_kernels"])
    assert out["extrapolated_kernels"]["fc1"]["shape_ratio"] == 2.0
    low, high = out["step_time_range_s"]
    assert low < out["step_time_predicted_s"] < high
    captured = load_captured([str(run_dir)])
    target = target_experiment(captured, settings=parse_settings(["parallel.tp=1",
                                                                  "parallel.dp=2"]))
    book = learn(captured.traces, target.cluster, target.model, target.layout,
                 statistic=Statistic.MEDIAN)
    ln2 = next(op for op in build(target.model, target.layout).ops[1]
               if op.name == "ln2" and op.kind is OpKind.COMPUTE)
    seen = [op.end - op.start for ops in captured.first.ops.values() for op in ops
            if op.kind is OpKind.COMPUTE and shape_key(op) == shape_key(ln2)]
    timing = book.time(ln2)
    assert timing.source is Source.MEASURED and timing.seconds == statistics.median(seen)
    # the run's link probe (4 sizes x 32 calls) and its TP all-reduces time the new ones by
    # default; --links cluster keeps the cluster's figures
    assert len(probe_samples(captured.first)) == len(PROBE_BYTES) * PROBE_CALLS
    assert 0 < captured.first.meta.host_probe["cpu_share"] <= 1  # of a core, per rank
    assert out["links_fitted_to_capture"]["samples"] >= len(PROBE_BYTES)
    plain = run_json(capsys, "whatif", run_dir, "--set", "parallel.tp=1", "--set",
                     "parallel.dp=2", "--links", "cluster")
    assert "links_fitted_to_capture" not in plain

