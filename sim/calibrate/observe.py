"""What a timed trace says about the machine: one sample per measured communication and
compute op, in the terms the simulator times them.

    comm, compute = observe(trace)

Communication (`CommSample`): the simulator starts a collective when its last member arrives
and ends it for every member at once, and starts a transfer when both its send and its receive
are issued. So a collective — the k-th call of each member on one (stream, group), matched as
the replay's meetings match them — lasted from its members' latest start to their mean end; a
transfer, from the later of its send's and receive's starts to the receive's end. In a
partial trace (one rank's profiler file of a larger job) the members present stand for the
absent ones, as the replay mirrors them: the collective lasted what the present members saw.

Compute (`ComputeSample`): an op's cost is what it holds its stream for (`traces.compare.
occupancy`, the rule validation compares by). When the next op on the stream did not wait for
anything, that is from this op's start to the next one's: the interpreter's bookkeeping
between two kernels is paid per op, like a kernel launch on a GPU, and the simulator's launch
overhead stands for both. Otherwise it is the op's own duration plus the stream's median gap.

The microbenchmarks' interference collectives (`traces.bench`, their purpose a `Bench`
collective) are no samples: they time, on purpose, what compute beside them does to them
(`sim.calibrate.interference` reads them). Ops without times, ops of a span (a profiler's
fused region, timed only as a whole), and compute ops that are not kernels of the plan (by
their purpose; an imported op without one, by its name) are skipped.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from traces.bench import sections
from traces.compare import occupancy
from traces.kernel_groups import KERNEL_NAMES
from traces.ops import Op, OpKind, Phase, Trace
from traces.purpose import Bench, BenchRole, KernelRun

KERNELS = frozenset(KERNEL_NAMES)
_INTERFERENCE = frozenset((Bench(BenchRole.COLLECTIVE_BESIDE),
                           Bench(BenchRole.COLLECTIVE_ALONE)))


@dataclass(frozen=True, slots=True)
class CommSample:
    kind: OpKind
    group: tuple[int, ...]
    """Collective: its members; transfer: (source, destination)."""
    size_bytes: float
    seconds: float


@dataclass(frozen=True, slots=True)
class ComputeSample:
    name: str
    backward: bool
    flops: float
    mem_bytes: float
    gemm: tuple[int, ...]
    seconds: float
    draws: float = 0.0

    @property
    def key(self) -> tuple[object, ...]:
        """Samples of one kernel on one shape share this key."""
        return (self.name, self.backward, self.flops, self.mem_bytes, self.gemm, self.draws)


def observe(trace: Trace) -> tuple[list[CommSample], list[ComputeSample]]:
    """The communication and compute samples of one timed trace (see the module docstring)."""
    return communication(trace), compute(trace)


def _timed(op: Op) -> bool:
    return op.start is not None and op.end is not None and op.span is None


def _times(op: Op) -> tuple[float, float]:
    assert op.start is not None and op.end is not None, "a timed op"
    return op.start, op.end


def communication(trace: Trace) -> list[CommSample]:
    calls: dict[tuple[str, tuple[int, ...], int], list[Op]] = defaultdict(list)
    sends: dict[tuple[int, int, str], list[Op]] = defaultdict(list)
    recvs: dict[tuple[int, int, str], list[Op]] = defaultdict(list)
    for rank in trace.ranks:
        count: dict[tuple[str, tuple[int, ...]], int] = defaultdict(int)
        for op in trace.ops[rank]:
            if op.kind.is_collective and op.purpose not in _INTERFERENCE:
                key = (op.stream, op.group)
                calls[(*key, count[key])].append(op)
                count[key] += 1
            elif op.kind is OpKind.SEND and op.peer is not None:
                sends[(rank, op.peer, op.tag)].append(op)
            elif op.kind is OpKind.RECV and op.peer is not None:
                recvs[(op.peer, rank, op.tag)].append(op)
    out = []
    present = set(trace.ranks)
    for (_, group, _), members in calls.items():
        first = members[0]
        if len(members) != len(present.intersection(group)) or \
                not all(_timed(m) for m in members) or \
                any(m.kind is not first.kind or m.size_bytes != first.size_bytes
                    for m in members):
            continue
        start = max(_times(m)[0] for m in members)
        end = statistics.fmean(_times(m)[1] for m in members)
        if end > start and first.size_bytes > 0:
            out.append(CommSample(first.kind, group, first.size_bytes, end - start))
    for (src, dst, tag), sent in sends.items():
        for send, recv in zip(sent, recvs.get((src, dst, tag), [])):
            if not (_timed(send) and _timed(recv)) or send.size_bytes != recv.size_bytes:
                continue
            start = max(_times(send)[0], _times(recv)[0])
            end = _times(recv)[1]
            if end > start and send.size_bytes > 0:
                out.append(CommSample(OpKind.SEND, (src, dst), send.size_bytes, end - start))
    return out


def compute(trace: Trace) -> list[ComputeSample]:
    out = []
    for rank in trace.ranks:
        for op, seconds in occupancy(trace.ops[rank], _section_starts(trace, rank)):
            kernel = _kernel(op)
            if kernel is not None:
                out.append(ComputeSample(kernel, op.phase is Phase.BWD, op.flops,
                                         op.mem_bytes, tuple(op.gemm), seconds, op.draws))
    return out


def _kernel(op: Op) -> str | None:
    """The plan kernel a compute op ran: its purpose's; an imported op's (no purpose) name if
    that is one."""
    if isinstance(op.purpose, KernelRun):
        return str(op.purpose.kernel)
    return op.name if op.purpose is None and op.name in KERNELS else None


def _section_starts(trace: Trace, rank: int) -> set[int]:
    """The first op of each microbenchmark section: a barrier starts it, so the time from the
    previous op to it is the barrier's wait, not the previous kernel's."""
    ranges = [s["ranges"].get(str(rank)) for s in sections(trace)
              if isinstance(s.get("ranges"), dict)]
    return {r[0] for r in ranges if isinstance(r, list) and r and isinstance(r[0], int)}
