"""Ops and traces: the one vocabulary shared by the plan builder, the executor and the simulator.

A `Trace` holds, per rank, an ordered tuple of `Op`s. An op runs on a named stream: ops on one
stream run in list order, ops on different streams overlap, and `deps` (indices into the same
rank's list) order ops across streams. Ranks meet only through communication: the k-th
collective a rank issues on a group matches the k-th that every other member issues on it (as
NCCL matches calls on a communicator), and the k-th send from a to b with a tag matches the k-th
recv on b from a with that tag. A *plan* has no times; a *timed* trace has `start`/`end`
(seconds) on every op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from operator import attrgetter

from traces.alltoallv import AllToAllv
from traces.header import TraceMeta
from traces.kinds import COLLECTIVES, OpKind
from traces.purpose import Purpose

__all__ = ["COLLECTIVES", "COPY_STREAMS", "Op", "OpKind", "Phase", "Purpose", "Stream", "Trace",
           "op_row", "row_of", "stamp",
           "stamp_phase"]


class Stream(StrEnum):
    """The streams a plan puts its ops on. A trace read from elsewhere may name others (a
    profiler's CUDA streams), so `Op.stream` is any string; plans use these.

    compute    layers' kernels, and the tensor-parallel collectives Megatron issues inline
    recv_prev / send_next    activations between pipeline stages
    recv_next / send_prev    their gradients
    dp         gradient buckets, the tied-embedding all-reduce, ZeRO-1/2 parameter all-gathers
    zero_ag / zero_rs        ZeRO-3 (FSDP) per-layer parameter all-gather, gradient reduce-scatter
    cp_send / cp_recv        context parallelism's ring of K/V (and dK/dV) messages
    tp_comm                  with tp_comm_overlap: the chunked TP collectives beside the GEMM chunks
    *_v                      zbv: the same four for the V's second leg (its own peers and order)
    ep_comm                  with overlap_moe_comm: MoE's dispatch and combine all-to-alls
    d2h / h2d                with cpu_offloading_num_layers: activation copies to the host and
                             back (Transformer Engine's two copy streams, `traces.plan.offload`)
    """

    COMPUTE = "compute"
    RECV_PREV = "recv_prev"
    SEND_NEXT = "send_next"
    RECV_NEXT = "recv_next"
    SEND_PREV = "send_prev"
    DP = "dp"
    ZERO_AG = "zero_ag"
    ZERO_RS = "zero_rs"
    CP_SEND = "cp_send"
    CP_RECV = "cp_recv"
    TP_COMM = "tp_comm"
    RECV_PREV_V = "recv_prev_v"
    SEND_NEXT_V = "send_next_v"
    RECV_NEXT_V = "recv_next_v"
    SEND_PREV_V = "send_prev_v"
    EP_COMM = "ep_comm"
    D2H = "d2h"
    H2D = "h2d"


COPY_STREAMS = frozenset({Stream.D2H, Stream.H2D})
"""The streams of host copies: copy engines move their bytes, no SMs run them."""


class Phase(StrEnum):
    FWD = "fwd"
    BWD = "bwd"
    RECOMPUTE = "recompute"
    """A forward pass re-run inside the backward pass (activation recomputation)."""
    OPT = "opt"
    WGRAD = "wgrad"
    """The weight gradients of a backward split in two (zero-bubble schedules'
    W, `traces.zero_bubble`); the rest of that backward stays `bwd`."""


@dataclass(slots=True, kw_only=True)
class Op:
    """One unit of work on one rank. Fields that do not apply to the kind keep their defaults.

    A value, never mutated once built (derive timed copies with `dataclasses.replace`). It is
    not `frozen=True` only for speed: a frozen dataclass's __init__ takes 5.7 us against 1.7 us
    here, and a 1024-GPU plan builds ~300,000 ops.
    """

    kind: OpKind
    stream: str
    name: str = ""
    """A display label ('qkv', 'tp', 'grads', ...); what the op is for is its `purpose`."""
    purpose: Purpose | None = None
    """What the op is for (`traces.purpose`); None for an op imported from elsewhere."""
    deps: tuple[int, ...] = ()
    layer: int | None = None
    microbatch: int | None = None
    phase: Phase | None = None
    flops: float = 0.0
    mem_bytes: float = 0.0
    """Bytes moved to and from HBM (compute ops)."""
    draws: float = 0.0
    """Random numbers drawn (compute ops: dropout's masks), timed on the integer lanes."""
    gemm: tuple[int, ...] = ()
    """GEMM ops: (batch, M, N, K) of the forward product; a backward op runs its two
    gradient GEMMs (M×K×N and K×N×M)."""
    group: tuple[int, ...] = ()
    """Collective: member ranks, in communicator order."""
    size_bytes: float = 0.0
    """Collective: the buffer size as nccl-tests counts it; p2p: bytes sent."""
    split: AllToAllv | None = None
    """All-to-all: the bytes per (source, destination) where they are uneven
    (`traces.alltoallv`); None: each member sends `size_bytes` / n to every member."""
    dtype: str = "bf16"
    peer: int | None = None
    """Send/recv: the other rank."""
    tag: str = ""
    """Send/recv: sends match receives per (source, destination, tag), in order."""
    span: int | None = None
    """Measured ops that one call ran together (a profiler's fused region, an autograd call
    covering several plan ops) share a span id, and its start and end."""
    start: float | None = None
    end: float | None = None

    @property
    def duration(self) -> float:
        assert self.start is not None and self.end is not None, "op is not timed"
        return self.end - self.start

    @property
    def inline(self) -> bool:
        """Communication on the compute stream: the tensor- and sequence-parallel collectives
        (and the gathers after a pipeline receive) Megatron issues between the kernels they
        join, so the kernels wait for them (`Stream`), and the step end's gradient
        statistics (`GradStat`). The one statement of that rule."""
        return self.stream == Stream.COMPUTE and self.kind is not OpKind.COMPUTE


OpRow = tuple[object, ...]
"""Every field of an op, in `Op`'s order (`op_row`): what `stamp` copies into a new op."""

_SLOTS = tuple(f.name for f in fields(Op))

row_of: Callable[[Op], OpRow] = attrgetter(*_SLOTS)
"""The row of an op that exists (`op_row`'s, read in C): `stamp(row_of(op), op.layer,
op.microbatch)` is a copy of `op`, at a tenth of `dataclasses.replace(op)`'s cost."""


def op_row(**values: object) -> OpRow:
    """The fields of `Op(**values)` (the others at their defaults), in `Op`'s order: a row a
    plan pass prepares once and `stamp`s per layer and micro-batch."""
    op = Op(**values)  # type: ignore[arg-type]
    return tuple(getattr(op, name) for name in _SLOTS)


def _stamper(extra: tuple[str, ...]) -> Callable[..., Op]:
    """A function (row, layer, microbatch, *extra) -> the op of `row` with those fields set:
    `Op(**fields, layer=..., ...)` without a call's keyword dictionary and `__init__` (a
    third of the time; a 1024-GPU plan makes ~10^6 ops). Made from `Op`'s own fields, so it
    sets every one."""
    names = ("layer", "microbatch", *extra)
    source = (f"def stamp(row, {', '.join(names)}):\n"
              f"    op = _new(_Op)\n"
              f"    {', '.join(f'op.{name}' for name in _SLOTS)}, = row\n"
              + "".join(f"    op.{name} = {name}\n" for name in names)
              + "    return op\n")
    scope: dict[str, object] = {"_new": object.__new__, "_Op": Op}
    exec(source, scope)  # as `dataclasses` makes `__init__`
    return scope["stamp"]  # type: ignore[return-value]


stamp: Callable[[OpRow, int | None, int | None], Op] = _stamper(())
"""stamp(row, layer, microbatch): `Op(**fields, layer=layer, microbatch=microbatch)` where
`row` is `op_row(**fields)`."""
stamp_phase: Callable[[OpRow, int | None, int | None, Phase | None], Op] = _stamper(("phase",))
"""stamp_phase(row, layer, microbatch, phase): likewise, the phase set too."""


@dataclass(frozen=True, slots=True)
class Trace:
    """Ops per rank plus the typed header (model, layout, fold, cluster: `traces.header`)."""

    ops: Mapping[int, tuple[Op, ...]]
    meta: TraceMeta = field(default_factory=TraceMeta)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.ops)

    @property
    def timed(self) -> bool:
        return all(op.end is not None for ops in self.ops.values() for op in ops)

    def num_ops(self) -> int:
        return sum(len(ops) for ops in self.ops.values())
