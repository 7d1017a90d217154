"""`parasim run`: execute a config's plan for real and write the measured traces.

    from executor.run import run
    result = run(experiment, "out/", steps=2, warmup=1, timeout=60)

`experiment` is anything with `.model` (ModelSpec), `.layout` (Layout) and `.cluster` (whose
`[cluster]` table the traces carry, `meta.cluster_spec`) — the CLI's loaded TOML — or a
(model, layout) pair. The plan is built and lowered for every rank first, so a plan
the executor cannot run is a ConfigError before anything starts. Then the world is spawned here
(or joined, under torchrun), clocks are aligned, `warmup` steps run unrecorded and `steps`
recorded ones; the last recorded step is written to `out_dir` (rank<r>.json per rank and a
merged chrome.json for Perfetto). If a rank fails, the traces recorded so far are written,
marked incomplete, and `JobFailed` is raised with `.files` set.

`kernels=True` runs the recorded steps under `torch.profiler` (CPU activity, CUDA too on GPU)
and each rank writes its profiler trace as `kernels-rank<r>.json` (read by
`traces.kineto.load_kineto`): the kernels inside each measured op. The recorded op times then
include the profiler's own overhead. Under torchrun each rank writes to its own host's
`out_dir`; a failed rank writes none.

`trace_ranks` (sorted ranks of the world) keeps only those ranks in the written files
(rank<r>.json, chrome.json, kernels-rank<r>.json): every rank still runs, and the result's
trace and step times still cover them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from executor.comm import Comm, CommCall
from executor.groups import Groups, plan_group_keys
from executor.interpreter import Interpreter
from executor.launch import JobFailed, RankContext, in_torchrun, spawn
from executor.options import RunOptions, as_run, check_supported
from executor.probe import cpu_share, probe_links, probe_table
from executor.program import lower
from executor.recorder import (
    DONE,
    H_CLOCK_ERROR,
    H_OFFSET,
    HEADER,
    NOT_RECORDED,
    Recorder,
    buffer_size,
    measure_clocks,
    run_meta,
    timed_trace,
    write_rank,
    write_run,
)
from executor.torchrun import join
from executor.watch import H_OPS, H_STEP
from traces.chrome import event_name
from traces.cluster_table import ClusterTable
from traces.errors import ConfigError
from traces.header import TraceMeta
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Trace
from traces.plan import build


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    trace: Trace
    """The last recorded step, timed (seconds from its first op)."""
    files: list[Path]
    step_seconds: list[float]
    """Each recorded step, first op start to last op end over all ranks."""
    losses: list[float]
    """Mean loss of each recorded step."""
    peak_memory_bytes: dict[int, int]
    calls: dict[int, list[CommCall]]
    """Each rank's torch.distributed calls in the first recorded step (when asked for)."""


def specs(experiment: Any) -> tuple[ModelSpec, Layout]:
    if isinstance(experiment, tuple):
        model, layout = experiment
    else:
        model, layout = experiment.model, experiment.layout
    return model, layout


def cluster_table(experiment: Any) -> ClusterTable | None:
    """The `[cluster]` table of the experiment's cluster (None for a (model, layout) pair):
    the measured traces carry it, so `parasim replay` rebuilds the cluster they ran on. CPU
    ranks on this host (the localhost preset) share its cores: the table states how many
    (`cores`, unless it gives them), so `parasim whatif` knows when a target's ranks outnumber
    them (`topology.cluster.Cluster.time_shared`)."""
    if isinstance(experiment, tuple):
        return None
    table: ClusterTable | None = experiment.cluster.table
    if table is None or table.preset != "localhost" or experiment.cluster.cores:
        return table
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return dataclasses.replace(table, overrides=tuple(sorted((*table.overrides,
                                                              ("cores", cores or 1)))))


def run(experiment: Any, out_dir: str | Path, steps: int = 1, warmup: int = 1,
        timeout: float = 60.0, *, backend: str = "auto", options: RunOptions | None = None,
        record_calls: bool = False, fault: tuple[int, ...] | None = None,
        kernels: bool = False, trace_ranks: tuple[int, ...] | None = None
        ) -> RunResult | None:
    """Run the plan for real; see the module docstring. Under torchrun, ranks other than 0
    get None. `fault` = (rank, op index[, signal number]): that rank raises there in the first
    recorded step, or sends itself the signal (SIGKILL, SIGSTOP: for testing fault handling)."""
    if steps < 1 or warmup < 0:
        raise ConfigError(f"run: steps {steps} must be >= 1 and warmup {warmup} >= 0")
    model, layout = specs(experiment)
    options = options or RunOptions()
    if not isinstance(experiment, tuple):  # DeepEP's nodes are the cluster's (executor.hops)
        options = dataclasses.replace(options,
                                      gpus_per_node=experiment.cluster.devices_per_server)
    check_supported(model, layout, options)
    plan = as_run(build(model, layout), options)
    for rank in plan.ops:  # every op mapped before anything starts
        lower(plan, model, layout, rank)
    plan_group_keys(plan, layout)
    job = _Job(plan, model, layout, options, steps, warmup, record_calls, str(out_dir), fault,
               kernels, cluster_table(experiment), trace_ranks)
    slots = buffer_size(max(len(ops) for ops in plan.ops.values())) - HEADER
    if in_torchrun():  # every rank runs this; rank 0 writes the run and gets the result
        mine = join(_rank_main, (job,), timeout_s=timeout, backend=backend,
                    record_slots=slots, on_failure=functools.partial(_write_partial, job))
        return mine.get("run")
    try:
        results, records = spawn(_rank_main, layout.world, (job,), timeout_s=timeout,
                                 backend=backend, record_slots=slots,
                                 describe=lambda r, i: event_name(plan.ops[r][i]))
    except JobFailed as failed:
        meta = _meta(job, backend="", complete=False, error=str(failed))
        failed.files = write_run(out_dir, job.written(timed_trace(plan, failed.records, meta)))
        raise
    return _result(job, results, records)


@dataclass(frozen=True, slots=True)
class _Job:
    plan: Trace
    model: ModelSpec
    layout: Layout
    options: RunOptions
    steps: int
    warmup: int
    record_calls: bool
    out_dir: str
    fault: tuple[int, ...] | None = None
    kernels: bool = False
    cluster: ClusterTable | None = None
    trace_ranks: tuple[int, ...] | None = None

    def keeps(self, rank: int) -> bool:
        """Whether this rank's files are written (`trace_ranks`)."""
        return self.trace_ranks is None or rank in self.trace_ranks

    def written(self, trace: Trace) -> Trace:
        """The part of `trace` the files hold: the kept ranks (every rank by default)."""
        if self.trace_ranks is None:
            return trace
        return Trace({r: ops for r, ops in trace.ops.items() if self.keeps(r)}, trace.meta)


def _meta(job: _Job, backend: str, **extra: Any) -> TraceMeta:
    config = {"model": dataclasses.asdict(job.model), "layout": job.layout.to_dict(),
              "steps": job.steps, "warmup": job.warmup, "seed": job.options.seed,
              "dropout": job.options.dropout}
    return run_meta(job.plan.meta, backend=backend, world_size=job.layout.world, config=config,
                    cluster_spec=job.cluster, **extra)


def _result(job: _Job, results: list[dict[str, Any]], records: dict[int, np.ndarray]
            ) -> RunResult:
    backend = results[0]["backend"]
    step_seconds = _step_seconds(results)
    meta = _meta(job, backend=backend, complete=True,
                 clock=results[0]["clock"], step_seconds=tuple(step_seconds),
                 host_probe=probe_table([res["probe"] for res in results], job.layout.world))
    trace = timed_trace(job.plan, records, meta)
    files = write_run(job.out_dir, job.written(trace))
    if job.kernels:
        files += [kernels_path(job.out_dir, r) for r in sorted(records) if job.keeps(r)]
    losses = []
    for step in range(job.steps):
        values = [v for res in results if res["last_stage_tp0"] for v in res["losses"][step]]
        losses.append(float(np.mean(values)))
    return RunResult(trace=trace, files=files, step_seconds=step_seconds,
                     losses=losses, peak_memory_bytes={r: res["peak"]
                                                       for r, res in enumerate(results)},
                     calls={r: res["calls"] for r, res in enumerate(results)})


def _step_seconds(results: list[dict[str, Any]]) -> list[float]:
    spans = [res["spans"] for res in results]
    return [(max(s[k][1] for s in spans) - min(s[k][0] for s in spans)) / 1e9
            for k in range(len(spans[0]))]


# --- on each rank ----------------------------------------------------------------------------

def _rank_main(ctx: RankContext, job: _Job) -> dict[str, Any]:
    layout = job.layout
    groups = Groups.create(plan_group_keys(job.plan, layout), ctx.timeout_s)
    comm = Comm(groups)
    offset, error, method = measure_clocks(ctx.rank, ctx.world_size, ctx.device)
    ctx.records[H_OFFSET], ctx.records[H_CLOCK_ERROR] = offset, error
    recorder = Recorder(ctx.records, ctx.device)
    interp = Interpreter(job.plan, job.model, layout, ctx.rank, comm, job.options, ctx.device,
                         recorder)
    ctx.records[H_OPS] = len(interp.ops)  # for the launcher's progress (executor.watch)
    for _ in range(job.warmup):
        recorder.reset()
        interp.step()
        interp.runtime.losses.clear()
    if job.fault is not None and job.fault[0] == ctx.rank:
        interp.calls[job.fault[1]] = functools.partial(_injected_fault, *job.fault[2:])
    spans, losses = [], []
    profiled = job.kernels and job.keeps(ctx.rank)
    profiler = _profiler(ctx.device) if profiled else contextlib.nullcontext()
    with profiler:
        for step in range(job.steps):
            comm.record = job.record_calls and step == 0
            recorder.reset()
            ctx.records[H_STEP] = step + 1
            if ctx.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            interp.runtime.meter.reset_peak()
            dist.barrier()
            interp.step()
            comm.record = False
            times = recorder.times[:len(interp.ops)]
            done = times[times[:, 0] != NOT_RECORDED]
            spans.append((int(done[:, 0].min()) - offset, int(done[:, 1].max()) - offset))
            losses.append(list(interp.runtime.losses.values()))
            interp.runtime.losses.clear()
    if isinstance(profiler, torch.profiler.profile):
        path = kernels_path(job.out_dir, ctx.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(path))
    probe = {"links": probe_links(ctx.device), "cpu_share": cpu_share()}
    recorder.set_state(DONE)
    c = layout.coords(ctx.rank)
    result = {"backend": ctx.backend, "clock": method, "spans": spans, "losses": losses,
              "last_stage_tp0": c.pp == layout.stage_rank(layout.num_stages - 1) and c.tp == 0,
              "peak": interp.peak_bytes(), "calls": comm.calls, "probe": probe}
    groups.destroy()
    if in_torchrun():
        result["run"] = _gather_and_write(ctx, job, result)
    return result


def kernels_path(out_dir: str | Path, rank: int) -> Path:
    """Where `--kernels` puts a rank's torch.profiler trace."""
    return Path(out_dir) / f"kernels-rank{rank}.json"


def _profiler(device: torch.device) -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities, record_shapes=True)


def _write_partial(job: _Job, ctx: RankContext, error: str) -> list[Path]:
    """Under torchrun, a failing rank writes what it recorded: rank<r>.json, marked
    incomplete, its times from its own first op (no peer is left to align with); none for a
    rank that `trace_ranks` leaves out."""
    if not job.keeps(ctx.rank):
        return []
    plan = Trace({ctx.rank: job.plan.ops[ctx.rank]}, job.plan.meta)
    meta = _meta(job, backend=ctx.backend, complete=False, error=error)
    trace = timed_trace(plan, {ctx.rank: ctx.records}, meta)
    return [write_rank(job.out_dir, trace, ctx.rank)]


def _injected_fault(signum: int | None = None) -> None:
    if signum is not None:
        os.kill(os.getpid(), signum)
    raise ValueError("injected fault")


def _gather_and_write(ctx: RankContext, job: _Job, result: dict[str, Any]) -> RunResult | None:
    """Under torchrun: rank 0 collects every rank's records and writes the run (control
    traffic after the recorded steps, not through the recorded wrapper)."""
    gathered: list[Any] = [None] * ctx.world_size
    dist.gather_object((ctx.records.copy(), result), gathered if ctx.rank == 0 else None, dst=0)
    if ctx.rank != 0:
        return None
    records = {r: rec for r, (rec, _) in enumerate(gathered)}
    return _result(job, [res for _, res in gathered], records)
