"""The NCCL path, on GPUs (marked `gpu`; skipped without CUDA and NCCL): a DP-2 plan (one
rank when only one GPU is there) trains as the single-process reference on the CPU, its ops
are timed by CUDA events (an asynchronous NCCL call's end too), and peak memory is
torch.cuda.max_memory_allocated.

    pytest -m gpu tests/executor/test_gpu.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the executor runs on torch

import torch

from executor.consistency import problems
from executor.launch import nccl_usable, pick_backend, spawn
from executor.params import tp_shard
from executor.recorder import timed_trace
from executor.reference import train
from executor.run import run
from tests.executor.checks import ref_key
from tests.executor.workers import ADAMW, OPTIONS, Case, device_case
from traces.ops import Trace
from traces.plan import build

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not nccl_usable(), reason="needs CUDA and NCCL")]

NUM_GPUS = min(2, torch.cuda.device_count()) if torch.cuda.is_available() else 1
CASE = Case(dict(dp=NUM_GPUS, global_batch=4, bucket_bytes=20_000))
TIMEOUT_S = 120  # the first CUDA context and NCCL communicators take seconds
# fp32 on the GPU against fp32 on the CPU: the same sums in another order
LOSS_REL, PARAM_ATOL = 1e-4, 1e-4
EVENT_SLACK_S = 50e-6  # two events behind one NCCL completion, on two streams


def _late_dependencies(trace: Trace, slack_s: float) -> list[str]:
    """Dependencies ending more than `slack_s` after their dependant starts."""
    late = []
    for rank, ops in trace.ops.items():
        for i, op in enumerate(ops):
            assert op.start is not None
            for dep in op.deps:
                end = ops[dep].end
                assert end is not None
                if end > op.start + slack_s:
                    late.append(f"rank {rank} op {i} starts {end - op.start:.2e} s early")
    return late


def test_dp_on_nccl_trains_as_the_reference_timed_by_cuda_events() -> None:
    assert pick_backend(NUM_GPUS) == "nccl"
    results, _ = spawn(device_case, NUM_GPUS, (CASE,), timeout_s=TIMEOUT_S)
    model, layout = CASE.specs()
    ref = train(model, layout.global_batch, CASE.steps, OPTIONS.seed, ADAMW)
    for step, ref_loss in enumerate(ref.losses):
        values = [v for res in results for v in res["losses"][step].values()]
        assert len(values) == layout.dp * layout.num_microbatches
        assert statistics.fmean(values) == pytest.approx(ref_loss, rel=LOSS_REL)
    for rank, res in enumerate(results):
        assert res["backend"] == "nccl" and res["device"] == f"cuda:{rank}"
        for unit, tensors in res["params"].items():
            for name, got in tensors.items():
                want = tp_shard(model, name, ref.params[ref_key(model, unit, name)], 1, 0)
                torch.testing.assert_close(got, want, rtol=0, atol=PARAM_ATOL)
        # every op's start and end were CUDA events, resolved at the step's flush
        assert res["events"] == [2 * res["num_ops"]] * CASE.steps
        for peak, max_allocated, meter in res["peaks"]:
            assert peak == max_allocated > 0
            assert meter > 0  # the CPU count runs too, but is not what is reported
    plan = build(model, layout)
    trace = timed_trace(plan, {r: res["records"] for r, res in enumerate(results)}, plan.meta)
    assert trace.meta.complete is True
    found = problems(trace, plan=plan)
    assert all("dependency" in line for line in found), found
    assert _late_dependencies(trace, EVENT_SLACK_S) == []


def test_run_picks_nccl_and_reports_cuda_peaks(tmp_path: Path) -> None:
    model, layout = CASE.specs()
    result = run((model, layout), tmp_path, steps=1, warmup=1, timeout=TIMEOUT_S,
                 options=OPTIONS)
    assert result is not None
    meta = result.trace.meta
    assert meta.backend == "nccl" and meta.complete is True
    ref = train(model, layout.global_batch, 2, OPTIONS.seed, ADAMW)
    assert result.losses == pytest.approx(ref.losses[1:], rel=LOSS_REL)
    params_bytes = 4 * sum(t.numel() for t in ref.params.values()) // layout.dp
    assert all(peak >= params_bytes for peak in result.peak_memory_bytes.values())
    assert _late_dependencies(result.trace, EVENT_SLACK_S) == []
