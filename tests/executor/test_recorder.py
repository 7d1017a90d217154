"""Recording and faults, with the plan's communication run for real on two ranks (compute ops
stand in as small matmuls): the measured trace holds together and opens in Perfetto; a rank
that raises, dies or hangs ends the job in bounded time with one line naming it, and the
traces recorded so far are written, marked incomplete."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.consistency import problems
from executor.launch import JobFailed, spawn
from executor.recorder import buffer_size, load_run, run_meta, timed_trace, write_run
from tests.executor.plan_match import call_sequences, plan_sequences
from tests.executor.workers import SMALL, walk_plan
from traces.chrome import event_name
from traces.header import TraceMeta
from traces.header_json import meta_to_json
from traces.io import load
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Trace
from traces.plan import build

TIMEOUT_S = 15
MODEL = ModelSpec(**SMALL)  # type: ignore[arg-type]


def _plan(**layout: object) -> Trace:
    return build(MODEL, Layout(**layout))  # type: ignore[arg-type]


def _run(plan: Trace, *args: object, timeout_s: float = TIMEOUT_S) -> tuple[list, dict]:
    slots = buffer_size(max(len(ops) for ops in plan.ops.values()))
    return spawn(walk_plan, len(plan.ops), (plan, *args), timeout_s=timeout_s,
                 record_slots=slots, describe=lambda r, i: event_name(plan.ops[r][i]))


def _meta(plan: Trace, **extra: Any) -> TraceMeta:
    assert plan.meta.layout is not None
    return run_meta(plan.meta, backend="gloo", world_size=len(plan.ops),
                    config={"layout": plan.meta.layout.to_dict()}, **extra)


def test_measured_trace_holds_together_and_opens(tmp_path: Path) -> None:
    plan = _plan(tp=2, sp=True, global_batch=2)
    calls, records = _run(plan)
    trace = timed_trace(plan, records, _meta(plan))
    assert trace.meta.complete is True
    assert problems(trace, plan=plan) == []
    for rank in trace.ranks:  # the plan's communication, call for call
        assert call_sequences(calls[rank]) == plan_sequences(plan.ops[rank])
    meta = trace.meta
    assert {"host", "torch", "backend", "world", "config", "peak_memory_bytes",
            "clock_offsets_ns", "clock_error_ns"} <= set(meta_to_json(meta))
    assert meta.layout == plan.meta.layout  # the plan's header, and the run's
    paths = write_run(tmp_path, trace)
    back = load_run(tmp_path)
    assert [op.start for op in back.ops[1]] == [op.start for op in trace.ops[1]]
    assert load(paths[0]).meta.complete is True
    chrome = json.loads((tmp_path / "chrome.json").read_text())
    spans = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == trace.num_ops()


@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_failing_rank_ends_the_job_and_partial_traces_are_written(tmp_path: Path,
                                                                     how: str) -> None:
    plan = _plan(dp=2, global_batch=4, bucket_bytes=20_000)
    fail_at = len(plan.ops[1]) // 2
    start = time.monotonic()
    with pytest.raises(JobFailed) as info:
        _run(plan, fail_at, how)
    assert time.monotonic() - start < TIMEOUT_S
    name = event_name(plan.ops[1][fail_at])
    expected = "ValueError: injected fault" if how == "raise" else "process died (exit code 3)"
    assert str(info.value) == f"rank 1 failed in op {fail_at} ({name}): {expected}"
    trace = timed_trace(plan, info.value.records, _meta(plan, error=str(info.value)))
    assert trace.meta.complete is False
    timed = [op.end is not None for op in trace.ops[1]]
    assert timed == [True] * fail_at + [False] * (len(timed) - fail_at)
    assert any(op.end is not None for op in trace.ops[0])
    write_run(tmp_path, trace)
    assert load(tmp_path / "rank1.json").meta.complete is False
    json.loads((tmp_path / "chrome.json").read_text())


def test_a_hanging_rank_is_named_within_the_timeout() -> None:
    plan = _plan(dp=2, global_batch=2)
    fail_at = len(plan.ops[1]) // 2
    start = time.monotonic()
    with pytest.raises(JobFailed) as info:
        _run(plan, fail_at, "hang", timeout_s=3)
    assert time.monotonic() - start < 3 + 5  # the job timeout, and the grace to stop ranks
    message = str(info.value)
    assert f"rank 1 in op {fail_at}" in message or f"rank 1 stopped in op {fail_at}" in message
