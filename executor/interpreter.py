"""The plan interpreter: one rank runs its plan's ops in order, each as its own timed call.

The program (`executor.program.lower`) says what each op does; the interpreter only keeps the
plan's two orders:

    dependencies   before an op starts, every op it depends on has finished (an asynchronous
                   op's handle is waited on)
    streams        an op on a communication stream is issued once the previous op on that
                   stream has finished (ops on one stream run in order; gloo runs a group's
                   calls on two threads, so issue order alone would not keep them apart)

Compute ops and the collectives on the compute stream (Megatron's inline TP ones) run
synchronously; ops on the other streams are issued asynchronously and their end is taken when
their work completes. A failing op re-raises with `parasim_op` naming it, which the launcher
reports.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable, Iterable

import torch

from executor.calls import (
    Call,
    CeCollective,
    Compute,
    ComputeChunk,
    CpAttend,
    CpExchange,
    CpMessage,
    EmbeddingAllReduce,
    ExpertExchange,
    ExpertGather,
    ExpertGradReduce,
    GatherBucket,
    GatherReceived,
    GatherUnit,
    GradAccumulate,
    GradStatAllReduce,
    OptimizerStep,
    ReduceBucket,
    RoutingGather,
    SpAllReduce,
    StepKernel,
    TpChunkCollective,
    TpCollective,
    Transfer,
)
from executor.comm import Comm, Handle
from executor.memory import MemoryMeter
from executor.options import RunOptions
from executor.program import RankProgram, lower
from executor.recorder import Recorder
from executor.runtime import RankRuntime
from traces.chrome import event_name
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Stream, Trace

WAIT_S = 20e-6  # on GPU: how often a waiting rank looks again at its queues and calls in flight
# On CPU every call in flight is watched (Handle.watch) and wakes a waiting rank as it
# completes; this bounds the wait should anything else ever have to be noticed. (Polling every
# WAIT_S cost a pipeline rank ~1,600 wake-ups a step, CPU its peer's kernels needed.)
NOTIFIED_WAIT_S = 1e-3


class Interpreter:
    """One rank's plan bound to its runtime; `step()` runs the plan once."""

    def __init__(self, plan: Trace, model: ModelSpec, layout: Layout, rank: int, comm: Comm,
                 options: RunOptions, device: torch.device, recorder: Recorder,
                 program: RankProgram | None = None) -> None:
        self.ops, self.comm = plan.ops[rank], comm
        program = program or lower(plan, model, layout, rank)
        self.runtime = RankRuntime(model, layout, rank, comm, options, device,
                                   buckets=program.buckets, meter=MemoryMeter())
        self.recorder = recorder
        self.cuda = device.type == "cuda"
        self.calls: list[Callable[[], Handle | None]] = [bind(self.runtime, call)
                                                          for call in program.calls]
        self.deps = [op.deps + program.waits.get(i, ()) for i, op in enumerate(self.ops)]
        self.on_compute = [op.stream == Stream.COMPUTE for op in self.ops]

    def step(self) -> None:
        """Run every op of the plan once (one training step)."""
        run = _StepRun(self)
        try:
            run.all()
        except Exception as exc:
            index = run.current
            if index >= 0 and not hasattr(exc, "parasim_op"):
                exc.parasim_op = f"op {index} ({event_name(self.ops[index])})"  # type: ignore[attr-defined]
            raise
        self.recorder.flush()
        self.runtime.end_step()

    def peak_bytes(self) -> int:
        if self.cuda:
            return torch.cuda.max_memory_allocated()
        return self.runtime.meter.peak_bytes


def _nothing() -> None:
    """A call whose work another part of the runtime does."""


def bind(rt: RankRuntime, call: Call) -> Callable[[], Handle | None]:
    """The runtime operation a call names, with its arguments (one arm per `Call` type)."""
    p = functools.partial
    match call:
        case Compute(kernel=kernel, phase=phase, layer=layer, mb=mb, part=part):
            return p(rt.compute, kernel, phase, layer, mb, part)
        case GradAccumulate():
            return _nothing
        case OptimizerStep():
            return rt.optimizer_step
        case StepKernel(kernel=kernel):
            return p(rt.step_kernel, kernel)
        case GradStatAllReduce(stat=stat, group=group, stream=stream):
            return p(rt.grad_stat, stat, group, stream)
        case TpCollective(site=site, layer=layer, mb=mb):
            return p(rt.tp, site, layer, mb)
        case ComputeChunk(kernel=kernel, phase=phase, part=part, index=index, count=count,
                          layer=layer, mb=mb):
            return p(rt.gemm_chunk, kernel, phase, part, index, count, layer, mb)
        case TpChunkCollective(chunk=chunk, layer=layer, mb=mb, stream=stream):
            return p(rt.tp_chunk, chunk, layer, mb, stream)
        case CeCollective(stat=stat, mb=mb):
            return p(rt.ce_collective, stat, mb)
        case GatherReceived(boundary=boundary, mb=mb, tag=tag):
            return p(rt.pipe.gather_received, boundary, mb, tag)
        case SpAllReduce(unit=unit, stream=stream):
            return p(rt.sp_grads, unit, stream)
        case EmbeddingAllReduce():
            return rt.embedding_grads
        case ReduceBucket(index=index, stream=stream):
            return p(rt.reduce_bucket, index, stream)
        case GatherBucket(index=index, stream=stream):
            return p(rt.gather_bucket, index, stream)
        case GatherUnit(unit=unit, stream=stream):
            return p(rt.gather_unit, unit, stream)
        case CpAttend(phase=phase, layer=layer, mb=mb, step=step):
            return p(rt.cp_attend, phase, layer, mb, step)
        case CpMessage(send=send, step=step, backward=backward, phase=phase, layer=layer, mb=mb,
                       peer=peer, tag=tag):
            return p(rt.cp_message, phase, send, step, backward, layer, mb, peer, tag)
        case CpExchange(grad=grad, phase=phase, layer=layer, mb=mb):
            return p(rt.cp_exchange, grad, phase, layer, mb)
        case ExpertExchange(step=step, grad=grad, layer=layer, mb=mb, stream=stream):
            return p(rt.expert_all_to_all, step, grad, layer, mb, stream)
        case RoutingGather(layer=layer):
            return p(rt.routing_gather, layer)
        case ExpertGradReduce(layer=layer, stream=stream):
            return p(rt.expert_grads, layer, stream)
        case ExpertGather(layer=layer, stream=stream):
            return p(rt.gather_experts, layer, stream)
        case Transfer(send=True, boundary=boundary, mb=mb, tag=tag, peer=peer):
            return p(rt.pipe.send, boundary, mb, tag, peer)
        case Transfer(send=False, boundary=boundary, mb=mb, tag=tag, peer=peer):
            return p(rt.pipe.recv, boundary, mb, tag, peer)
    raise AssertionError(f"no runtime operation for {call!r}")


class _StepRun:
    """One pass over the ops, with the simulator's semantics: each stream runs its ops in plan
    order, independently of the others except through dependencies. Compute-stream ops run
    here, in order, once their dependencies are done; every other stream is a queue (all of
    its ops, from the start) whose head is issued once its dependencies are done and the
    stream's previous op has finished. While the compute stream waits, the queues keep
    moving."""

    def __init__(self, interp: Interpreter) -> None:
        self.interp = interp
        n = len(interp.ops)
        self.handles: list[Handle | None] = [None] * n
        self.done = [False] * n
        self.queues: dict[str, deque[int]] = {}
        for index, op in enumerate(interp.ops):
            if not interp.on_compute[index]:
                self.queues.setdefault(op.stream, deque()).append(index)
        self.inflight: dict[str, int] = {}
        self.current = -1
        self.progress = threading.Event()  # a call in flight completed
        self.blocking = False  # in block_on: a synchronous collective is in flight
        self.pause_s = WAIT_S if interp.cuda else NOTIFIED_WAIT_S

    def all(self) -> None:
        comm = self.interp.comm
        if not self.interp.cuda:
            comm.block = self.block_on  # a blocking collective keeps the queues moving
        try:
            self._all()
        finally:
            comm.block = None

    def _all(self) -> None:
        it = self.interp
        self.advance()
        for index in range(len(it.ops)):
            if not it.on_compute[index]:
                continue
            self.wait_for(it.deps[index])
            self.current = index
            it.recorder.begin(index)
            it.calls[index]()
            it.recorder.end(index)
            self.done[index] = True
            it.recorder.note_peak(it.peak_bytes())
            self.advance()
        self.wait_for(range(len(it.ops)))
        self.current = -1

    def finished(self, index: int) -> bool:
        """Whether op `index` is done, completing an asynchronous one that has finished."""
        if self.done[index]:
            return True
        handle = self.handles[index]
        if handle is None or not handle.finished():
            return False
        self.current = index
        handle.wait()  # runs its completion step here, on this thread
        self.interp.recorder.settle(index)
        self.done[index] = True
        return True

    def advance(self) -> None:
        """Issue every queue head that may start."""
        it, moved = self.interp, True
        while moved:
            moved = False
            for stream, queue in self.queues.items():
                busy = self.inflight.get(stream)
                if busy is not None and not self.finished(busy):
                    continue
                if queue and all(self.finished(d) for d in it.deps[queue[0]]):
                    index = queue.popleft()
                    self.current = index
                    it.recorder.begin(index)
                    handle = it.calls[index]()
                    self.handles[index] = handle
                    if handle is None:
                        it.recorder.end(index)
                        self.done[index] = True
                    else:
                        handle.notify = self.progress
                        it.recorder.end_on_completion(index, handle, stream)
                    self.inflight[stream] = index
                    moved = True

    def block_on(self, handle: Handle) -> None:
        """Wait for a collective the running op made synchronously, issuing queue heads
        meanwhile: on CPU a blocked rank must still send what its peers need to reach the
        same collective (a zb1p pipeline deadlocked here: one rank in the step's grad-norm
        all-reduce, its last gradient send still queued behind a send in flight). Calls
        issued from here wait plainly (no nesting)."""
        if self.blocking:
            handle.wait()
            return
        self.blocking, current = True, self.current
        try:
            handle.notify = self.progress
            handle.watch()
            while True:
                self.progress.clear()  # before looking: a completion from now on wakes us
                if handle.finished():
                    break
                self.advance()
                if handle.finished() or not any(self.queues.values()):
                    break
                self.progress.wait(self.pause_s)
        finally:
            self.blocking, self.current = False, current
        handle.wait()

    def wait_for(self, indices: Iterable[int]) -> None:
        for index in indices:
            while True:
                self.progress.clear()  # before looking: a completion from now on wakes us
                if self.finished(index):
                    break
                self.advance()
                if self.finished(index):
                    break
                handle = self.handles[index]
                if handle is not None and (self.interp.cuda or not any(self.queues.values())):
                    # on GPU, wait() only makes the current stream wait for the work; on CPU
                    # it blocks, which is right once nothing else could move meanwhile
                    handle.wait()
                else:
                    self.progress.wait(self.pause_s)
