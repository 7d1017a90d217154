"""The plan interpreter on the real plans (traces.plan.build): every layout family trains as
the single-process reference; each rank's communication is its plan's and nothing else; the
GEMMs do the plan's FLOPs; the measured trace holds together; and `executor.run` writes a
trace Perfetto opens, or, when a rank fails, partial traces marked incomplete."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.consistency import problems
from executor.launch import JobFailed, spawn
from executor.recorder import timed_trace
from executor.reference import train
from executor.run import run
from tests.executor.checks import check_training
from tests.executor.plan_match import call_sequences, plan_sequences
from tests.executor.workers import ADAMW, LLAMA, MLA, OPTIONS, Case, interpret_cases
from traces.io import load
from traces.plan import build

TIMEOUT_S = 60
FOUR = dict(layers=4)
WORLD2 = {
    "dp": Case(dict(dp=2, global_batch=4, bucket_bytes=20_000)),
    "zero1": Case(dict(dp=2, zero=1, global_batch=4, bucket_bytes=20_000)),
    "zero2": Case(dict(dp=2, zero=2, global_batch=4, bucket_bytes=20_000)),
    "zero3": Case(dict(dp=2, zero=3, global_batch=4)),
    "tp": Case(dict(tp=2, global_batch=2)),
    "tp-sp-unfused-selective": Case(dict(tp=2, sp=True, global_batch=2, recompute="selective"),
                                    model=dict(attention="unfused")),
    "gpipe": Case(dict(pp=2, global_batch=4, schedule="gpipe")),
    "1f1b-full": Case(dict(pp=2, global_batch=4, recompute="full")),
    "interleaved": Case(dict(pp=2, vp=2, schedule="interleaved", global_batch=4), model=FOUR),
    "llama-tp": Case(dict(tp=2, global_batch=2), model=LLAMA),
    "llama-tp-sp-unfused-full": Case(dict(tp=2, sp=True, global_batch=2, recompute="full"),
                                     model=dict(LLAMA, attention="unfused")),
    "llama-mqa-1f1b-selective": Case(dict(pp=2, global_batch=4, recompute="selective"),
                                     model=dict(LLAMA, kv_heads=1, tied_embeddings=False)),
    # Lighter first stage: 1 layer on pipeline rank 0, 3 on rank 1 (pp_first_layers).
    "1f1b-uneven": Case(dict(pp=2, global_batch=4, pp_first_layers=1), model=FOUR),
    # Context parallelism: Transformer Engine's ring, and Llama 3's all-gather (issue 18).
    "cp2-ring-full": Case(dict(cp=2, global_batch=2, recompute="full")),
    "cp2-gather-selective": Case(dict(cp=2, cp_comm="all_gather", global_batch=4,
                                      recompute="selective")),
    "llama-cp2-ring": Case(dict(cp=2, global_batch=2), model=LLAMA),
    "llama-mqa-cp2-gather": Case(dict(cp=2, cp_comm="all_gather", global_batch=2),
                                 model=dict(LLAMA, kv_heads=1)),
    # issue 20: Megatron-Core's overlaps, their chunked collectives asynchronous on side streams
    "tp-sp-comm-overlap-full": Case(dict(tp=2, sp=True, global_batch=2, recompute="full",
                                         tp_comm_overlap=True)),
    # torch's AsyncTP (kernels = "compiled"): qkv/fc1 backward inline, produce chunks, the sum
    "llama-tp-sp-asynctp-full": Case(dict(tp=2, sp=True, global_batch=2, recompute="full",
                                          tp_comm_overlap=True),
                                     model=dict(LLAMA, kernels="compiled")),
    # torch's DTensor SP (kernels eager/compiled): the gathered input kept, no gather again
    "llama-tp-sp-eager": Case(dict(tp=2, sp=True, global_batch=2), model=dict(LLAMA,
                                                                          kernels="eager")),
    "zero1-param-gather-overlap": Case(dict(dp=2, zero=1, global_batch=4, bucket_bytes=20_000,
                                            overlap_param_gather=True)),
    # Latent attention (issue 19): TP splits its heads, its down-projection is replicated.
    "mla-tp": Case(dict(tp=2, global_batch=2), model=MLA),
    "mla-tp-qproj-unfused-selective": Case(dict(tp=2, global_batch=2, recompute="selective"),
                                           model=dict(MLA, q_lora_rank=0, attention="unfused")),
}
WORLD8 = {"tp2-pp2-dp2": Case(dict(tp=2, pp=2, dp=2, sp=True, global_batch=8,
                                   bucket_bytes=20_000)),
          # without SP: pipeline messages as TP chunks, all-gathered after each receive
          "tp2-pp2-dp2-interleaved": Case(dict(tp=2, pp=2, dp=2, vp=2, schedule="interleaved",
                                               global_batch=8, bucket_bytes=20_000),
                                          model=FOUR),
          # issue 20: both of Megatron-Core's overlaps with a pipeline and ZeRO-1
          "tp2-pp2-dp2-overlaps": Case(dict(tp=2, pp=2, dp=2, sp=True, zero=1, global_batch=8,
                                            bucket_bytes=20_000, tp_comm_overlap=True,
                                            overlap_param_gather=True),
                                       model=dict(tied_embeddings=False))}
FLOPS = {"tp-unfused": Case(dict(tp=2, global_batch=2), model=dict(attention="unfused"), steps=1),
         "dp-flash": Case(dict(dp=2, global_batch=2), steps=1),
         "llama-tp-unfused": Case(dict(tp=2, global_batch=2),
                                  model=dict(LLAMA, attention="unfused"), steps=1)}


def _world(cases: dict[str, Case], size: int, count_flops: bool = False) -> dict[str, list]:
    results, _ = spawn(interpret_cases, size, (list(cases.values()), count_flops),
                       timeout_s=TIMEOUT_S)
    return {name: list(per_rank) for name, per_rank in zip(cases, zip(*results))}


@pytest.fixture(scope="module")
def world2() -> dict[str, list]:
    return _world(WORLD2, 2)


@pytest.fixture(scope="module")
def world8() -> dict[str, list]:
    return _world(WORLD8, 8)


def _check(case: Case, results: list) -> None:
    model, layout = case.specs()
    check_training(model, layout, results,
                   train(model, layout.global_batch, case.steps, OPTIONS.seed, ADAMW))
    plan = build(model, layout)
    for rank, result in enumerate(results):
        assert call_sequences(result["calls"]) == plan_sequences(plan.ops[rank]), f"rank {rank}"
    trace = timed_trace(plan, {r: res["records"] for r, res in enumerate(results)}, plan.meta)
    assert trace.meta.complete is True
    assert problems(trace, plan=plan) == []


@pytest.mark.parametrize("name", list(WORLD2))
def test_two_ranks(world2: dict, name: str) -> None:
    _check(WORLD2[name], world2[name])


@pytest.mark.parametrize("name", list(WORLD8))
def test_eight_ranks_3d(world8: dict, name: str) -> None:
    _check(WORLD8[name], world8[name])


def test_gemms_do_the_plans_flops() -> None:
    """torch.utils.flop_counter, around each op: a GEMM op does its planned FLOPs, every other
    op none (flash attention excepted: the counter does not see the CPU kernel)."""
    results = _world(FLOPS, 2, count_flops=True)
    for name, per_rank in results.items():
        model, layout = FLOPS[name].specs()
        plan = build(model, layout)
        for rank, res in enumerate(per_rank):
            counted = dict(zip(range(len(plan.ops[rank])), res["flops"]))
            for index, op in enumerate(plan.ops[rank]):
                if op.name == "flash_attn" or op.kind != "compute":
                    continue
                want = op.flops if op.gemm else 0.0
                assert counted[index] == want, (name, rank, index, op.name, op.phase)


def test_run_writes_a_trace_perfetto_opens(tmp_path: Path) -> None:
    case = Case(dict(dp=2, global_batch=4))
    model, layout = case.specs()
    start = time.monotonic()
    result = run((model, layout), tmp_path, steps=2, warmup=1, timeout=TIMEOUT_S,
                 options=OPTIONS)
    assert result is not None and time.monotonic() - start < 60
    ref = train(model, layout.global_batch, 3, OPTIONS.seed, ADAMW)
    assert result.losses == pytest.approx(ref.losses[1:], rel=1e-5)  # after one warm-up step
    assert len(result.step_seconds) == 2 and all(s > 0 for s in result.step_seconds)
    assert problems(result.trace, plan=build(model, layout)) == []
    chrome = json.loads((tmp_path / "chrome.json").read_text())
    assert sum(e["ph"] == "X" for e in chrome["traceEvents"]) == result.trace.num_ops()
    meta = load(tmp_path / "rank0.json").meta
    assert meta.complete is True and meta.backend == "gloo" and meta.world == 2
    assert set(meta.peak_memory_bytes or {}) == {0, 1}
    # one host: one clock, no offset and no error
    assert meta.clock == "shared clock"
    assert meta.clock_offsets_ns == meta.clock_error_ns == {0: 0, 1: 0}


def test_run_with_a_failing_rank_writes_partial_traces(tmp_path: Path) -> None:
    case = Case(dict(dp=2, global_batch=4))
    model, layout = case.specs()
    plan = build(model, layout)
    fail_at = len(plan.ops[1]) // 2
    start = time.monotonic()
    with pytest.raises(JobFailed) as info:
        run((model, layout), tmp_path, steps=1, warmup=0, timeout=15, fault=(1, fail_at))
    assert time.monotonic() - start < 15
    assert str(info.value).startswith(f"rank 1 failed in op {fail_at} (")
    assert "injected fault" in str(info.value)
    assert info.value.files and load(tmp_path / "rank1.json").meta.complete is False
    json.loads((tmp_path / "chrome.json").read_text())
