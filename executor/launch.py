"""Starting the world: spawn one process per rank here, or join a world `torchrun` started.

    spawn(fn, world_size, args)   local processes; gloo on CPU, or NCCL with one GPU per rank
                                  when CUDA has enough GPUs; returns each rank's fn(ctx, *args)
    join(fn, args)                under torchrun (`executor.torchrun`)

One timeout bounds every collective (passed to init_process_group: gloo's default is 30
minutes) and the whole job, from the moment every rank has started (`STARTUP_S` bounds that). A
rank that raises or dies ends the job: the parent stops the other ranks (SIGTERM, then SIGKILL)
and raises `JobFailed`, one line naming the rank and the op it was running; the shared record
buffers survive for the caller to write partial traces. Ranks ignore SIGINT: Ctrl-C reaches the
parent, which ends them all (SIGTERM too: `sim.entry` makes it a KeyboardInterrupt), and
removes the rendezvous folder. Workers die with their parent (PR_SET_PDEATHSIG on Linux) and
with the launcher itself (`exit_with`: their parent is the fork server, which outlives a `kill
-9`ed launcher while they live), and exit by themselves after the timeout, so nothing is
orphaned.
A rank's own threads never print tracebacks (a peer's death breaks their waits too): the
parent's one line names the cause. A rank that stopped (SIGSTOP, a debugger) is named as such
when the job times out.

Workers start from a fork server that has imported torch once (a fresh interpreter per rank
would import it again: ~2 s each).
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from executor.failures import (
    JobFailed,
    RankFailure,
    failure,
    mark_failed,
    op_name,
    stopped_ranks,
    stopped_text,
)
from executor.lifeline import die_with_parent, exit_with, remove_tree
from executor.recorder import FAILED, H_OP, H_STARTED, H_STATE, HEADER
from executor.watch import H_JOINED, WATCH_S, current
from traces.errors import ConfigError

MAX_LOCAL_WORLD = 8
GRACE_S = 3.0  # after a failure: how long the other ranks get to exit on SIGTERM
STARTUP_S = 300.0
"""How long the ranks may take to start, before the job's timeout begins: the fork server
imports torch first, which on a host loaded by other work can take a minute or more."""
POLL_S = 0.05  # how often the parent looks whether every rank has started
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")


@dataclass(frozen=True, slots=True)
class RankContext:
    """What a worker function gets: who it is, its device, and its shared record buffer."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    timeout_s: float
    records: np.ndarray
    """int64 header (recorder.HEADER) + per-op (start, end) slots; shared with the parent."""

    def running(self, index: int) -> None:
        """Note the op index this rank is running (named if the rank fails)."""
        self.records[H_OP] = index


@dataclass(slots=True)
class _Job:
    procs: list[Any] = field(default_factory=list)
    readers: list[Connection] = field(default_factory=list)


def pick_backend(world_size: int, backend: str = "auto") -> str:
    if backend != "auto":
        return backend
    if nccl_usable() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def nccl_usable() -> bool:
    """CUDA present and this torch built with NCCL."""
    return torch.cuda.is_available() and dist.is_nccl_available()


def in_torchrun() -> bool:
    return all(v in os.environ for v in TORCHRUN_VARS)


# --- local spawn -------------------------------------------------------------------------------

def spawn(fn: Callable[..., Any], world_size: int, args: tuple = (), *, timeout_s: float = 60.0,
          backend: str = "auto", record_slots: int = 0,
          describe: Callable[[int, int], str] | None = None
          ) -> tuple[list[Any], dict[int, np.ndarray]]:
    """Run `fn(ctx, *args)` on `world_size` local ranks; returns (results by rank, records).

    `fn` must be importable (a module-level function). `record_slots`: int64 slots per rank
    for the recorder beyond the header. `describe(rank, op index)` names an op in errors.
    """
    if not 1 <= world_size <= MAX_LOCAL_WORLD:
        raise ConfigError(f"world size {world_size}: a local run spawns 1 to {MAX_LOCAL_WORLD} "
                          "ranks (use torchrun across hosts)")
    backend = pick_backend(world_size, backend)
    ctx = _context()
    shared = ctx.RawArray("q", world_size * (HEADER + record_slots))
    flat = np.frombuffer(shared, dtype=np.int64)
    flat[:] = -1
    records = {r: flat[r * (HEADER + record_slots):(r + 1) * (HEADER + record_slots)]
               for r in range(world_size)}
    for buf in records.values():
        buf[:HEADER] = 0
        buf[H_OP] = -1
    store = tempfile.mkdtemp(prefix="parasim-rdzv-")
    job = _Job()
    try:
        for rank in range(world_size):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker, daemon=True, name=f"parasim-rank{rank}", args=(
                rank, world_size, backend, timeout_s, f"file://{store}/store", shared,
                HEADER + record_slots, writer, fn, args, os.getpid()))
            proc.start()
            writer.close()
            job.procs.append(proc)
            job.readers.append(reader)
        results = _collect(job, world_size, timeout_s, records, describe)
    finally:
        _stop(job)
        remove_tree(store)
    return results, records


def _context() -> Any:
    # kineto (torch.profiler, `run --kernels`) logs each profiler start and stop on stderr
    # ("USDT: ... profiler_start") at level 5, its highest; 6 silences it. Read when the ranks'
    # fork server imports torch, so set before it starts.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    if sys.platform == "linux":
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "executor.launch"])
        return ctx
    return mp.get_context("spawn")


def _collect(job: _Job, world_size: int, timeout_s: float, records: dict[int, np.ndarray],
             describe: Callable[[int, int], str] | None) -> list[Any]:
    results: list[Any] = [None] * world_size
    pending = set(range(world_size))
    deadline = time.monotonic() + STARTUP_S
    started = False
    failures: list[RankFailure] = []
    watch = current()  # a command's progress bar, fed every WATCH_S
    while pending and not failures:
        now = time.monotonic()
        if not started and all(records[r][H_STARTED] for r in range(world_size)):
            started, deadline = True, now + timeout_s  # the job's time starts now
        left = deadline - now
        if left <= 0:
            break
        if watch is not None:
            watch(records)
        watched = [job.readers[r] for r in pending] + [job.procs[r].sentinel for r in pending]
        poll = left if started else min(left, POLL_S)
        for ready in wait(watched, timeout=min(poll, WATCH_S) if watch else poll):
            rank = _rank_of(job, ready)
            if rank not in pending:
                continue
            message = _read(job.readers[rank])
            if message is None and job.procs[rank].exitcode is None:
                continue  # the sentinel fired but the pipe has not closed yet
            if message is not None and message[0] == "ok":
                results[rank] = message[1]
                pending.discard(rank)
            else:
                failures.append(failure(rank, message, job.procs[rank], records, describe))
                pending.discard(rank)
    if watch is not None and not failures:
        watch(records)  # the counts at the end
    if failures:
        # Let the other ranks' reports arrive: the cause may be behind a peer's error.
        failures += _late_failures(job, pending, records, describe)
        mark_failed(records)
        cause = next((f for f in failures if f.cause), None)
        if cause is None and pending:  # the others gave up waiting on a rank that hangs
            halted = stopped_ranks(job.procs, pending)
            stuck, first = min(halted or pending), failures[0]
            raise JobFailed(f"{stopped_text([stuck], records, describe)}; the others gave up "
                            f"waiting on it (rank {first.rank}: {first.error})" if halted else
                            f"rank {stuck} stopped in {op_name(stuck, records, describe)} "
                            f"(rank {first.rank}: {first.error})", failures, records)
        cause = cause or failures[0]
        raise JobFailed(f"rank {cause.rank} failed in {cause.op}: {cause.error}", failures,
                        records)
    if pending and not started:
        mark_failed(records)
        late = ", ".join(str(r) for r in range(world_size) if not records[r][H_STARTED])
        raise JobFailed(f"ranks {late} did not start within {STARTUP_S:g} s (the fork server "
                        "imports torch first): the host is too loaded to start the job",
                        [RankFailure(r, "start-up", "did not start") for r in sorted(pending)],
                        records)
    if pending:
        mark_failed(records)
        stopped = stopped_ranks(job.procs, pending)
        if stopped:
            raise JobFailed(f"job timed out after {timeout_s:g} s: "
                            f"{stopped_text(stopped, records, describe)}; the others waited on it",
                            [RankFailure(r, op_name(r, records, describe), "stopped")
                             for r in stopped], records)
        where = ", ".join(f"rank {r} in {op_name(r, records, describe)}" for r in sorted(pending))
        raise JobFailed(f"job timed out after {timeout_s:g} s ({where})",
                        [RankFailure(r, op_name(r, records, describe), "timed out")
                         for r in sorted(pending)], records)
    return results


def _late_failures(job: _Job, pending: set[int], records: dict[int, np.ndarray],
                   describe: Callable[[int, int], str] | None) -> list[RankFailure]:
    """Reports (or deaths) of the still-running ranks in the next half second."""
    late = []
    end = time.monotonic() + 0.5
    while pending and time.monotonic() < end:
        watched = [job.readers[r] for r in pending] + [job.procs[r].sentinel for r in pending]
        for ready in wait(watched, timeout=max(0.0, end - time.monotonic())):
            rank = _rank_of(job, ready)
            if rank not in pending:
                continue
            message = _read(job.readers[rank])
            if message is None and job.procs[rank].exitcode is None:
                continue
            pending.discard(rank)
            if message is None or message[0] == "error":
                late.append(failure(rank, message, job.procs[rank], records, describe))
    return late


def _rank_of(job: _Job, ready: object) -> int:
    for rank, (reader, proc) in enumerate(zip(job.readers, job.procs)):
        if ready is reader or ready == proc.sentinel:
            return rank
    raise AssertionError("wait() returned an object we do not watch")


def _send(writer: Connection, message: tuple) -> None:
    # Plain pickle: Connection.send would share tensors through file descriptors that die with
    # the sending process.
    writer.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _read(reader: Connection) -> tuple | None:
    try:
        if reader.poll():
            return pickle.loads(reader.recv_bytes())
    except (EOFError, OSError):
        pass
    return None


def _stop(job: _Job) -> None:
    """End every rank still running: SIGTERM, then SIGKILL after a grace period."""
    for proc in job.procs:
        if proc.is_alive():
            proc.terminate()
    end = time.monotonic() + GRACE_S
    for proc in job.procs:
        proc.join(max(0.0, end - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
    for reader in job.readers:
        reader.close()


# --- inside a worker ---------------------------------------------------------------------------

def _worker(rank: int, world_size: int, backend: str, timeout_s: float, init_method: str,
            shared: Any, stride: int, writer: Connection, fn: Callable[..., Any],
            args: tuple, launcher: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if not os.environ.get("PARASIM_TRACEBACK"):  # the parent's line names the cause
        threading.excepthook = _quiet_thread
    die_with_parent()
    exit_with(launcher, os.path.dirname(init_method.removeprefix("file://")))
    exit_after(timeout_s + 2 * GRACE_S)
    records = np.frombuffer(shared, dtype=np.int64)[rank * stride:(rank + 1) * stride]
    records[H_STARTED] = 1  # the parent's job timeout starts when every rank is here
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    ctx = RankContext(rank, world_size, rank, backend, device, timeout_s, records)
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        records[H_JOINED] = 1
        result = fn(ctx, *args)
        _send(writer, ("ok", result))
    except BaseException as exc:  # report anything, then leave without waiting on peers
        records[H_STATE] = FAILED
        _report(writer, exc)
        writer.close()
        os._exit(1)
    writer.close()
    dist.destroy_process_group()


def _quiet_thread(args: threading.ExceptHookArgs) -> None:
    """A thread's uncaught error, on a rank: not printed (a wait broken by a dead peer)."""


def _report(writer: Connection, exc: BaseException) -> None:
    op = getattr(exc, "parasim_op", "")
    with contextlib.suppress(OSError):
        _send(writer, ("error", op, describe_error(exc)))
    if os.environ.get("PARASIM_TRACEBACK"):
        traceback.print_exception(exc, file=sys.stderr)


def describe_error(exc: BaseException) -> str:
    """'ValueError: first line of the message'."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def exit_after(seconds: float) -> None:
    """A last resort: a rank outlives the job timeout only if its parent could not end it."""
    def watchdog() -> None:
        time.sleep(seconds)
        os._exit(124)
    threading.Thread(target=watchdog, daemon=True, name="parasim-watchdog").start()
