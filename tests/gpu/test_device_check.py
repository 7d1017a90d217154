"""tests/gpu/device_check.sh rehearsed on the CPU (DEVICE=cpu: a tiny fp32 model on one gloo
rank): every step runs within its budget, and the one JSON holds every figure the GPU run is
for, each consistent with the step outputs it came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the rehearsal runs the executor

from tests.gpu.device_figures import gemm_shapes  # noqa: E402

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "device_check.sh"
STEPS = ["env", "gpu_tests", "bench", "simulate", "run", "calibrate", "validate_preset",
         "validate_calibrated"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("device_check")
    env = {**os.environ, "OUT": str(out), "DEVICE": "cpu", "SKIP_INSTALL": "1",
           "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "BUDGET_S": "400"}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=480)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, json.loads((out / "device_check.json").read_text())


def test_every_step_ran_and_passed(rehearsal):
    _, s = rehearsal
    assert [step["name"] for step in s["steps"]] == STEPS
    assert s["ok"] is True, s["steps"]
    assert sum(step["seconds"] for step in s["steps"]) < 400
    assert s["gpu_tests"]["failures"] == s["gpu_tests"]["errors"] == 0
    assert s["gpu_tests"]["tests"] >= 1  # collected (skipped here: no CUDA)
    assert s["env"]["device"] == "cpu" and s["env"]["torch"]


def test_gemm_figures_are_the_formula_over_the_time(rehearsal):
    _, s = rehearsal
    gemms = s["bench"]["gemm"]
    assert [(g["m"], g["k"], g["n"]) for g in gemms] == list(gemm_shapes("cpu").values())
    for g in gemms:
        assert g["tflops"] == pytest.approx(2 * g["m"] * g["k"] * g["n"] / g["seconds"] / 1e12)
    bench = s["bench"]
    assert bench["memory_bandwidth_GBps"] > 0 and bench["copy_bytes"] == 2**26


def test_validate_errors_against_both_profiles(rehearsal):
    out, s = rehearsal
    preset, calibrated = s["validate"]["preset"], s["validate"]["calibrated"]
    assert preset["profile"]["calibrated"] is False
    assert calibrated["profile"]["calibrated"] is True
    for v in (preset, calibrated):
        measured, predicted = v["step_time_measured_s"], v["step_time_predicted_s"]
        assert v["step_error"] == pytest.approx((predicted - measured) / measured)
        assert set(v["op_abs_error"]) == {"median", "p90"} and v["mape_by_op_class"]
    # the calibrated validation used the profile the calibrate step wrote
    profile = json.loads((out / "calibrated.json").read_text())
    assert calibrated["profile"]["name"] == profile["name"]


def test_run_and_calibrate_figures(rehearsal):
    out, s = rehearsal
    assert s["run"]["backend"] == "gloo" and len(s["run"]["step_times_s"]) == 2
    assert s["simulate"]["fits"] is True
    kernels = {k["name"] for k in s["calibrate"]["kernels"]}
    assert {"qkv", "fc1", "fc2", "logits", "flash_attn"} <= kernels
    text = (out / "device_check.txt").read_text()
    assert text.startswith("device check: ok")
    assert "validate vs calibrated profile: step error" in text
    assert "GEMM logits" in text


def test_a_failed_step_is_recorded_not_dropped(tmp_path):
    """The summary of a folder where a step failed: its status and last line are kept."""
    (tmp_path / "steps.tsv").write_text("env\t0\t1.0\nrun\t2\t0.5\n")
    (tmp_path / "run.err").write_text("parasim: error: model.layers: 0 must be ...\n")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "device_figures.py"),
                           "summary", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "device_check.json").read_text())
    assert s["ok"] is False and s["run"] is None
    assert s["steps"][1] == {"name": "run", "rc": 2, "seconds": 0.5, "timed_out": False,
                             "last_error_line": "parasim: error: model.layers: 0 must be ..."}
