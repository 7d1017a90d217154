"""Microbenchmarks through the executor: `parasim calibrate --run` measures the machine here.

    from executor.bench import run_bench
    from traces.bench import BenchSpec, probe_grid, sweep_sizes
    trace = run_bench(BenchSpec(world=2, sizes=sweep_sizes(4096, 2**20, 4),
                                probes=probe_grid("fp32")), "out/bench", timeout=120)

The plan (`traces.bench.bench_plan`) is run the way `parasim run` runs a model's plan: the same
launcher (spawned ranks or torchrun's), the same communicators per (stream, group) and the one
door to torch.distributed (`executor.comm`), the same interpreter loop with the plan's stream
and dependency rules (`executor.interpreter`), the same recorder and clock alignment, and the
same files (rank<r>.json per rank and chrome.json). The interference section (a GEMM alone, and
beside an asynchronous collective on the dp stream) runs like the collectives, through `Comm`;
broadcast (from the group's first member) and all-to-all run too. A probe section runs a
one-layer model's step with the executor's own runtime and kernels, so every per-op cost a real
run pays (the kernel, autograd, the tape, the interpreter's bookkeeping) is in its timings.
Sections run one after another, each started together on every rank (a barrier, not
recorded); every section runs `warmup` times unrecorded before the recorded pass.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.comm import Comm, Handle
from executor.groups import GroupKey, Groups
from executor.interpreter import Interpreter, _StepRun
from executor.launch import JobFailed, RankContext, in_torchrun, spawn
from executor.options import RunOptions, as_run
from executor.params import DTYPES
from executor.recorder import (
    DONE,
    H_CLOCK_ERROR,
    H_OFFSET,
    HEADER,
    Recorder,
    buffer_size,
    measure_clocks,
    run_meta,
    timed_trace,
    write_run,
)
from executor.torchrun import join
from executor.watch import H_OPS, H_STEP
from traces.bench import BenchSpec, Probe, bench_plan, sections
from traces.chrome import event_name
from traces.errors import ConfigError
from traces.header import TraceMeta
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Stream, Trace
from traces.plan import build


@dataclass(frozen=True, slots=True)
class _Job:
    spec: BenchSpec
    plan: Trace
    warmup: int


def run_bench(spec: BenchSpec, out_dir: str | Path, *, warmup: int = 1, timeout: float = 120.0,
              backend: str = "auto") -> Trace | None:
    """Run the microbenchmarks on `spec.world` ranks and write their timed trace to `out_dir`;
    returns it (None on torchrun ranks other than 0). A failed rank raises `JobFailed` with
    the partial traces written."""
    if warmup < 0:
        raise ConfigError(f"bench: warmup {warmup} must be >= 0")
    plan = as_run(bench_plan(spec), RunOptions())  # the probes draw no dropout
    job = _Job(spec, plan, warmup)
    slots = buffer_size(max(len(ops) for ops in plan.ops.values())) - HEADER
    if in_torchrun():
        mine = join(_rank_main, (job, str(out_dir)), timeout_s=timeout, backend=backend,
                    record_slots=slots)
        return mine.get("trace")
    try:
        results, records = spawn(_rank_main, spec.world, (job, ""), timeout_s=timeout,
                                 backend=backend, record_slots=slots,
                                 describe=lambda r, i: event_name(plan.ops[r][i]))
    except JobFailed as failed:
        meta = _meta(job, "", complete=False, error=str(failed))
        failed.files = write_run(out_dir, timed_trace(plan, failed.records, meta))
        raise
    trace = timed_trace(plan, records, _meta(job, results[0]["backend"], complete=True,
                                             clock=results[0]["clock"]))
    write_run(out_dir, trace)
    return trace


def _meta(job: _Job, backend: str, **extra: Any) -> TraceMeta:
    config = {"bench": {"world": job.spec.world, "repeats": job.spec.repeats,
                        "warmup": job.warmup, "sizes": list(job.spec.sizes)}}
    return run_meta(job.plan.meta, backend=backend, world_size=job.spec.world, config=config,
                    **extra)


# --- on each rank ----------------------------------------------------------------------------

class _Shifted:
    """The recorder as one section sees it: op i of the section is op offset + i of the rank."""

    def __init__(self, recorder: Recorder, offset: int) -> None:
        self.recorder, self.offset = recorder, offset

    def begin(self, index: int) -> None:
        self.recorder.begin(self.offset + index)

    def end(self, index: int) -> None:
        self.recorder.end(self.offset + index)

    def end_on_completion(self, index: int, handle: Handle, stream: str = "") -> None:
        self.recorder.end_on_completion(self.offset + index, handle, stream)

    def settle(self, index: int) -> None:
        self.recorder.settle(self.offset + index)

    def note_peak(self, peak_bytes: int) -> None:
        self.recorder.note_peak(peak_bytes)

    def flush(self) -> None:
        self.recorder.flush()


class _CommSection:
    """A collectives section: each op a call through `Comm` on preallocated buffers (views of
    two buffers of the largest size, so no allocation is timed)."""

    def __init__(self, ops: tuple[Op, ...], comm: Comm, recorder: _Shifted,
                 device: torch.device) -> None:
        self.ops, self.comm, self.recorder, self.device = ops, comm, recorder, device
        self.cuda = device.type == "cuda"  # how `_StepRun` waits (executor.interpreter)
        # Deps as the section's own indices (ops before it ran in an earlier section).
        self.deps = [tuple(d - recorder.offset for d in op.deps if d >= recorder.offset)
                     for op in ops]
        self.on_compute = [op.stream == Stream.COMPUTE for op in ops]
        largest: dict[str, int] = {}
        for op in ops:
            elements = int(op.size_bytes) // DTYPES[op.dtype].itemsize
            largest[op.dtype] = max(largest.get(op.dtype, 0), elements)
        self.buffers = {d: (torch.ones(n, dtype=DTYPES[d], device=device),
                            torch.ones(n, dtype=DTYPES[d], device=device))
                        for d, n in largest.items()}
        self.calls = [self._call(op, comm) for op in ops]

    def _call(self, op: Op, comm: Comm) -> Callable[[], Handle | None]:
        a, b = self.buffers.get(op.dtype, (None, None))
        n = int(op.size_bytes) // DTYPES[op.dtype].itemsize
        if op.kind.is_p2p:
            assert a is not None and b is not None and op.peer is not None
            if op.kind is OpKind.SEND:
                return lambda: comm.send(a[:n], op.peer, op.tag)  # type: ignore[arg-type]
            return lambda: comm.recv(b[:n], op.peer, op.tag)  # type: ignore[arg-type]
        if op.kind is OpKind.COMPUTE:  # the kernel between calls (traces.bench._gap_op)
            _, m, n, k = op.gemm
            x = torch.randn(m, k, dtype=DTYPES[op.dtype], device=self.device)
            y = torch.randn(k, n, dtype=DTYPES[op.dtype], device=self.device)

            def gemm() -> None:
                torch.mm(x, y)
            return gemm
        assert a is not None and b is not None
        key: GroupKey = (op.stream, op.group)
        g = len(op.group)
        # Off the compute stream a call is asynchronous (the interference section's
        # collective runs beside a kernel); on it, a call returns when done, as the plan's
        # inline collectives do.
        async_op = op.stream != Stream.COMPUTE
        if op.kind is OpKind.ALL_REDUCE:
            return lambda: comm.all_reduce(a[:n], key, async_op=async_op)
        if op.kind is OpKind.REDUCE_SCATTER:
            return lambda: comm.reduce_scatter(b[:n // g], a[:n], key, async_op=async_op)
        if op.kind is OpKind.ALL_GATHER:
            return lambda: comm.all_gather(a[:n], b[:n // g], key, async_op=async_op)
        if op.kind is OpKind.BROADCAST:  # from the first member, as sim.collectives has it
            return lambda: comm.broadcast(a[:n], op.group[0], key, async_op=async_op)
        if op.kind is OpKind.ALL_TO_ALL:
            return lambda: comm.all_to_all(b[:n], a[:n], key, async_op=async_op)
        raise ConfigError(f"bench: the executor does not run {op.kind}")

    def step(self) -> None:
        _StepRun(self).all()  # type: ignore[arg-type]

    def peak_bytes(self) -> int:
        return 0


def _rank_main(ctx: RankContext, job: _Job, out_dir: str) -> dict[str, Any]:
    plan, rank = job.plan, ctx.rank
    ops = plan.ops[rank]
    keys = sorted({(op.stream, op.group) for r in plan.ops for op in plan.ops[r]
                   if op.kind.is_collective})
    groups = Groups.create(keys, ctx.timeout_s)
    comm = Comm(groups)
    offset, error, method = measure_clocks(rank, ctx.world_size, ctx.device)
    ctx.records[H_OFFSET], ctx.records[H_CLOCK_ERROR] = offset, error
    recorder = Recorder(ctx.records, ctx.device)
    runs: list[Callable[[], None]] = []
    probes: dict[str, Interpreter] = {}  # a probe run again (another pass) reuses its model
    for section in sections(plan):
        start, stop = section["ranges"][str(rank)]
        shifted = _Shifted(recorder, start)
        if section["kind"] in ("collectives", "interference"):
            runs.append(_CommSection(ops[start:stop], comm, shifted, ctx.device).step)
            continue
        key = repr(sorted((k, v) for k, v in section.items() if k != "ranges"))
        if key not in probes:
            probes[key] = _probe(section, comm, ctx.device, stop - start)
        runs.append(functools.partial(_run_probe, probes[key], shifted))
    ctx.records[H_OPS] = len(ops)  # for the launcher's progress (executor.watch)
    for _ in range(job.warmup):
        _run_sections(runs)
    recorder.reset()
    ctx.records[H_STEP] = 1
    _run_sections(runs)
    recorder.set_state(DONE)
    groups.destroy()
    result: dict[str, Any] = {"backend": ctx.backend, "clock": method}
    if in_torchrun():
        result["trace"] = _gather_and_write(ctx, job, out_dir, result)
    return result


def _run_sections(runs: list[Callable[[], None]]) -> None:
    for run in runs:
        dist.barrier()
        run()


def _probe(section: dict[str, Any], comm: Comm, device: torch.device,
           num_ops: int) -> Interpreter:
    probe = Probe(model=ModelSpec(**section["model"]), micro_batch=section["micro_batch"],
                  microbatches=section["microbatches"])
    layout = probe.layout()
    plan = build(probe.model, layout)
    assert len(plan.ops[0]) == num_ops, "the probe's plan is the bench plan's section"
    # Each pass sets its own recorder (`_run_probe`).
    return Interpreter(plan, probe.model, layout, 0, comm, RunOptions(), device,
                       None)  # type: ignore[arg-type]


def _run_probe(interp: Interpreter, recorder: _Shifted) -> None:
    interp.recorder = recorder  # type: ignore[assignment]
    interp.step()


def _gather_and_write(ctx: RankContext, job: _Job, out_dir: str,
                      result: dict[str, Any]) -> Trace | None:
    """Under torchrun: rank 0 collects every rank's records and writes the trace."""
    gathered: list[Any] = [None] * ctx.world_size
    dist.gather_object(ctx.records.copy(), gathered if ctx.rank == 0 else None, dst=0)
    if ctx.rank != 0:
        return None
    records = dict(enumerate(gathered))
    trace = timed_trace(job.plan, records, _meta(job, result["backend"], complete=True,
                                                 clock=result["clock"]))
    write_run(out_dir, trace)
    return trace
