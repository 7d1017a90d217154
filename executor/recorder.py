"""Timing every op of a rank's plan, aligning rank clocks, and writing measured traces.

A rank records into an int64 array: a header (the op it is running, its peak memory, its clock
offset, its state) and (start, end) in nanoseconds per plan op, -1 where not recorded. When the
world is spawned locally the arrays live in shared memory, so the parent can still write every
rank's partial trace when a rank dies; under torchrun each rank owns its array.

Clocks: `time.perf_counter_ns` on CPU (CLOCK_MONOTONIC on Linux: one clock for all processes of
a host); CUDA events on GPU, resolved against a host timestamp taken at a synchronisation. An
asynchronous NCCL call ends when its work does on the GPU: an event on a side stream (one per
plan stream) made to wait on the work. (NCCL marks a work's future complete as soon as the work
is enqueued, so the host-side completion that times gloo's calls would be the issue time.)
Ranks on other hosts are aligned to rank 0 by ping-pong (Cristian's method: the offset from the
round with the smallest round trip, error at most half that round trip); ranks that share rank
0's boot id share its clock and get offset 0, error 0. The method, offsets and error bounds go
into the trace's meta (`clock`, `clock_offsets_ns`, `clock_error_ns`).
"""

from __future__ import annotations

import dataclasses
import platform
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from executor.comm import Handle
from traces.chrome import save_chrome
from traces.header import TraceMeta
from traces.io import PathLike, load, save
from traces.ops import Op, Trace

HEADER = 8
H_OP, H_PEAK, H_OFFSET, H_STATE, H_CLOCK_ERROR, H_STARTED = 0, 1, 2, 3, 4, 5
RUNNING, DONE, FAILED = 0, 1, 2
NOT_RECORDED = -1
CLOCK_ROUNDS = 8


def buffer_size(num_ops: int) -> int:
    """int64 slots one rank's records need."""
    return HEADER + 2 * num_ops


def new_buffer(num_ops: int) -> np.ndarray:
    buf = np.full(buffer_size(num_ops), NOT_RECORDED, dtype=np.int64)
    buf[:HEADER] = 0
    return buf


class Recorder:
    """Start and end of each plan op of one rank, in host nanoseconds (before alignment)."""

    def __init__(self, buffer: np.ndarray, device: torch.device | None = None) -> None:
        assert buffer.dtype == np.int64 and buffer.size >= HEADER
        self.buf = buffer
        self.times = buffer[HEADER:].reshape(-1, 2)
        self.cuda = device is not None and device.type == "cuda"
        self._events: dict[tuple[int, int], torch.cuda.Event] = {}
        self._side: dict[str, torch.cuda.Stream] = {}  # plan stream -> where its ends are noted
        self._ref: tuple[torch.cuda.Event, int] | None = None
        self._lock = threading.Lock()

    @property
    def num_ops(self) -> int:
        return len(self.times)

    def reset(self) -> None:
        """Forget the times of the previous step (the header stays)."""
        self.times[:] = NOT_RECORDED
        self._events.clear()
        if self.cuda:
            torch.cuda.synchronize()
            ref = torch.cuda.Event(enable_timing=True)
            ref.record()
            ref.synchronize()
            self._ref = (ref, time.perf_counter_ns())

    def begin(self, index: int) -> None:
        self.buf[H_OP] = index
        if self.cuda:
            self._event(index, 0)
        else:
            self.times[index, 0] = time.perf_counter_ns()

    def end(self, index: int) -> None:
        if self.cuda:
            self._event(index, 1)
        else:
            self.times[index, 1] = time.perf_counter_ns()

    def end_on_completion(self, index: int, handle: Handle, stream: str = "") -> None:
        """An asynchronous call ends when its work completes: on CPU in host time
        (`Handle.watch`: the work's future, or a thread waiting on it); on GPU at an event
        recorded behind the work on `stream`'s side stream."""
        if not self.cuda:
            handle.watch(lambda: self.settle(index))
            return
        side = self._side.get(stream)
        if side is None:
            side = self._side[stream] = torch.cuda.Stream()
        with torch.cuda.stream(side):
            if handle.work is not None and not handle.done:
                handle.work.wait()  # NCCL: `side` waits for the work (the host does not)
            self._event(index, 1)

    def settle(self, index: int) -> None:
        """The op has completed: its end is now, unless already noted (on GPU the end event
        replaces it at `flush`)."""
        with self._lock:
            if self.times[index, 1] == NOT_RECORDED:
                self.times[index, 1] = time.perf_counter_ns()

    def _event(self, index: int, which: int) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._events[(index, which)] = event

    def flush(self) -> None:
        """Resolve CUDA events into host nanoseconds (a synchronisation; call after a step)."""
        if not self.cuda or self._ref is None:
            return
        torch.cuda.synchronize()
        ref, ref_ns = self._ref
        for (index, which), event in self._events.items():
            self.times[index, which] = ref_ns + round(ref.elapsed_time(event) * 1e6)
        self._events.clear()

    def note_peak(self, peak_bytes: int) -> None:
        self.buf[H_PEAK] = peak_bytes

    def set_state(self, state: int) -> None:
        self.buf[H_STATE] = state


# --- clock alignment -------------------------------------------------------------------------

def host_key() -> int:
    """Identifies the clock: the boot id (Linux), else the host name."""
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        text = socket.gethostname()
    return int.from_bytes(text.encode()[:16].ljust(16, b"\0")[:8], "little") & (2**62 - 1)


def measure_clocks(rank: int, world_size: int, device: torch.device) -> tuple[int, int, str]:
    """This rank's clock minus rank 0's and the bound on that estimate's error, in ns, and the
    method used. Collective over the default group (call on every rank, outside recorded
    steps): rank 0 plays `CLOCK_ROUNDS` ping-pongs with each peer, which answers with its
    time and its host key."""
    if world_size == 1:
        return 0, 0, "single rank"
    dist.barrier()
    mine = torch.zeros(2, dtype=torch.int64, device=device)
    if rank == 0:
        # per peer: (offset, error bound)
        estimates = torch.zeros(world_size, 2, dtype=torch.int64, device=device)
        shared = True
        for peer in range(1, world_size):
            best_rtt, best = None, 0
            for _ in range(CLOCK_ROUNDS):
                t1 = time.perf_counter_ns()
                dist.send(torch.tensor([t1, 0], device=device), peer)
                dist.recv(mine, peer)
                t3 = time.perf_counter_ns()
                t2, key = int(mine[0]), int(mine[1])
                if best_rtt is None or t3 - t1 < best_rtt:
                    best_rtt, best = t3 - t1, t2 - (t1 + t3) // 2
            assert best_rtt is not None
            # the peer read its clock between t1 and t3: the offset is best ± rtt/2
            same = key == host_key()
            shared &= same
            estimates[peer, 0] = 0 if same else best
            estimates[peer, 1] = 0 if same else (best_rtt + 1) // 2
        for peer in range(1, world_size):
            dist.send(estimates[peer].clone(), peer)
        return 0, 0, "shared clock" if shared else "ping-pong (min round trip)"
    for _ in range(CLOCK_ROUNDS):
        dist.recv(mine, 0)
        dist.send(torch.tensor([time.perf_counter_ns(), host_key()], device=device), 0)
    estimate = torch.zeros(2, dtype=torch.int64, device=device)
    dist.recv(estimate, 0)
    return int(estimate[0]), int(estimate[1]), "aligned to rank 0"


# --- traces ----------------------------------------------------------------------------------

def run_meta(plan: TraceMeta, *, backend: str, world_size: int, config: Mapping[str, Any],
             **more: Any) -> TraceMeta:
    """The plan's header with what every measured trace carries: where and how it was
    measured (`more`: other `TraceMeta` fields, such as `complete` or `clock`)."""
    return dataclasses.replace(plan, measured=True, host=socket.gethostname(),
                               platform=platform.platform(), torch=str(torch.__version__),
                               backend=backend, world=world_size, config=dict(config), **more)


def timed_trace(plan: Trace, records: Mapping[int, np.ndarray], meta: TraceMeta) -> Trace:
    """The plan with each recorded op's start and end in seconds on rank 0's clock, from the
    earliest recorded start, and `meta` (`run_meta` of the plan's) as its header; ops not
    recorded keep no times, and then meta.complete is false."""
    origin = None
    for buf in records.values():
        times = buf[HEADER:].reshape(-1, 2)
        starts = times[:, 0][times[:, 0] != NOT_RECORDED]
        if starts.size:
            first = int(starts.min()) - int(buf[H_OFFSET])
            origin = first if origin is None else min(origin, first)
    ops: dict[int, tuple[Op, ...]] = {}
    complete = True
    memory = {}
    for rank, plan_ops in plan.ops.items():
        buf = records[rank]
        times = buf[HEADER:].reshape(-1, 2)[:len(plan_ops)]
        assert len(times) == len(plan_ops), f"rank {rank}: records for every plan op"
        offset = int(buf[H_OFFSET])
        timed = []
        for op, (start, end) in zip(plan_ops, times.tolist()):
            if start == NOT_RECORDED or end == NOT_RECORDED:
                complete = False
                timed.append(op)
                continue
            assert origin is not None
            timed.append(dataclasses.replace(op, start=(start - offset - origin) / 1e9,
                                             end=(end - offset - origin) / 1e9))
        complete &= int(buf[H_STATE]) == DONE
        ops[rank] = tuple(timed)
        memory[rank] = int(buf[H_PEAK])
    out_meta = dataclasses.replace(
        meta, peak_memory_bytes=memory,
        clock_offsets_ns={r: int(b[H_OFFSET]) for r, b in records.items()},
        clock_error_ns={r: int(b[H_CLOCK_ERROR]) for r, b in records.items()},
        complete=complete and meta.complete is not False)
    return Trace(ops, out_meta)


def write_run(out_dir: PathLike, trace: Trace) -> list[Path]:
    """`rank<r>.json` per rank (traces.io) and `chrome.json`, one Perfetto view of all ranks
    (only the timed ops, so an incomplete run opens too). Returns the paths written."""
    out = Path(out_dir)
    paths = [write_rank(out, trace, rank) for rank in trace.ranks]
    shown = {r: tuple(dataclasses.replace(op, deps=()) for op in ops if op.end is not None)
             for r, ops in trace.ops.items()}
    chrome = out / "chrome.json"
    save_chrome(Trace(shown, trace.meta), chrome)
    return [*paths, chrome]


def write_rank(out_dir: PathLike, trace: Trace, rank: int) -> Path:
    """`rank<r>.json`: the trace's ops of one rank, with its meta (traces.io)."""
    path = Path(out_dir) / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    save(Trace({rank: trace.ops[rank]}, trace.meta), path)
    return path


def load_run(out_dir: PathLike) -> Trace:
    """The per-rank files of a run merged back into one trace."""
    files = sorted(Path(out_dir).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    ops: dict[int, tuple[Op, ...]] = {}
    meta = TraceMeta()
    for path in files:
        part = load(path)
        ops.update(part.ops)
        meta = part.meta
    return Trace(ops, meta)
