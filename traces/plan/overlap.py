"""tp_comm_overlap: Transformer Engine's userbuffer overlap of the SP collectives with the GEMMs.

Megatron-LM's --tp-comm-overlap hands each transformer layer's four TP GEMMs to Transformer
Engine, whose `initialize_ub` (transformer_engine/pytorch/module/base.py) overlaps the
sequence-parallel all-gather or reduce-scatter with the GEMM that consumes or produces it,
with these default methods (`get_default_config`):

    qkv, fc1 fprop     ring_exchange  the input all-gathered as t - 1 exchanges with the ring
                                      neighbours, each beside the GEMM of the shard before
                                      (the rank's own shard first, beside no wait); num_splits
                                      = t; num_sm 1 and use_ce: the copy engines move it
    proj, fc2 fprop    pipeline       the GEMM in num_splits = 4 chunks of the tokens, each
                                      chunk's reduce-scatter beside the next chunk's GEMM;
                                      num_sm 16 with set_sm_margin: the GEMM runs on 16 SMs fewer
    proj, fc2 dgrad    ring_exchange  the output gradient all-gathered beside the input-gradient
                                      GEMM's chunks; the weight gradient then, on the whole
    qkv, fc1 dgrad     bulk           the all-gather of the saved input shard (for the weight
                                      gradient) beside the whole input-gradient GEMM
    qkv, fc1 wgrad     bulk           the reduce-scatter of that input gradient beside the
                                      whole weight-gradient GEMM (num_sm 16, set_sm_margin)

The output layer (logits) and the embedding are not TE layers: their collectives stay inline.
Each region becomes typed ops: `GemmChunk`s on the compute stream (the kernel's products cut
along the tokens, each costed as its own GEMM) and `TpChunk`s on the `tp_comm` stream, whose
dependencies state the method: a ring chunk k's GEMM waits for exchange k; a pipeline chunk's
reduce-scatter waits for its GEMM; the bulk weight gradient waits for the gather, the bulk
reduce-scatter for the input gradient. Every collective of a region waits for the compute op
before the region (where TE launches it), and the op after the region waits for the last one.
So on an uncontended network, with g a GEMM chunk's time and c a collective chunk's:

    ring (t chunks)        max(t·g, g + (t - 1)·c)
    pipeline (n chunks)    max(n·g + c, g + n·c)
    bulk                   max(AG, dgrad) + max(RS, wgrad)

With `[model] kernels = "compiled"` the overlap is torchtitan's AsyncTP instead: torch
Inductor's micro_pipeline_tp pass rewrites `all_gather -> mm` into symm_mem's
fused_all_gather_matmul and `mm -> reduce_scatter` into fused_matmul_reduce_scatter
(torch/_inductor/fx_passes/micro_pipeline_tp.py; torch/distributed/_symmetric_memory):

    qkv, fc1 fprop     ring           t GEMM chunks, the own shard's first; step k pulls one
                                      shard from a peer with a copy-engine copy (no SMs)
    proj, fc2 fprop    produce        t GEMM chunks: steps 1..t-1 each compute the partial sum
                                      of rank r + k's shard into a p2p buffer, which that rank
                                      pulls (copy engine, no SMs); the rank's own partial last,
                                      straight into its output, copied nowhere: t - 1 copies.
                                      Two p2p buffers and the steps alternating two streams, so
                                      GEMM chunk k + 2 waits for copy k (_pipelined_produce_and_
                                      all2all); then one kernel sums the t partials of the
                                      rank's shard (fused_matmul_reduce_scatter's reduce_fn
                                      over dim 0): it reads t shards and writes one, on the
                                      compute stream
    proj, fc2 dgrad    ring           the output gradient's all-gather beside the dgrad
    qkv, fc1 dgrad     not overlapped the reduce-scatter's input is the sum of the q, k, v (w1,
                                      w3) input gradients, not one mm: `_find_producer_matmul`
                                      matches only mm / _scaled_mm (through a reshape), so
                                      the collectives stay inline (`traces.plan.tensor`)

So, uncontended, a produce region is the chunks' chain: GEMM k ends at
max(GEMM k-1, copy k-2) + g, copy k (k < t - 1) at max(copy k-1, GEMM k) + c; the last GEMM
(the own shard, on the current stream after the loop) waits for the last copy that stream
issued (`own_wait`); the sum follows. Each copy moves one partial, size / t of the b·s·h
output, from one peer (torch/distributed/_symmetric_memory/__init__.py,
_pipelined_produce_and_all2all: `for step in range(1, group_size)`, then
`chunk_producer(rank, out_chunks[rank])`), so it is lowered as one peer copy (`peer_copy`)
as the ring exchange's steps are.

Each GEMM chunk is a GEMM call of its own on the whole weight: TE's userbuffers methods call
the GEMM once per chunk with the full weight operand and a slice of the tokens
(NVIDIA/TransformerEngine transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp:
the ring exchange's CommOverlapP2PBase::split_overlap_ag and split_overlap_rs, aggregate off,
call `nvte_cublas_gemm(A.data(), input_b_chunk.data(), output_chunk.data(), ...)` each step,
`A` the weight whole), and torch's fused_all_gather_matmul / fused_matmul_reduce_scatter
run one mm per chunk with the whole B (torch/distributed/_symmetric_memory/__init__.py).
Llama 3 405B's fc1 weight at TP 4 is 436 MB in FP8, far beyond any L2 (50 MB on H100,
126 MB on B200), so each chunk streams it from HBM again: a chunk's bytes are its share of
the op's activations and outputs plus the whole weight (`chunk_bytes`), the forward and the
input gradient alike (the weight gradient runs whole). TE's pipeline reduce-scatter
(CommOverlapBase::split_overlap_rs) chunks the other way: `get_tensor_chunk(A, i *
input_a_chunk_size, ...)` slices the weight's output rows (m_chunk = m / num_splits, the
reduce-scatter then strided, reducescatter2_userbuff_stridedoutput) and every chunk's GEMM
takes the input `B.data()` whole: there the input is read again. Summed over a region's
chunks: the product's bytes plus (chunks - 1) more reads of that operand.

The engine needs nothing new (streams and dependencies); the compute model costs a chunk by
its GEMM shape on the SMs its communication leaves it (`GemmChunk.comm_sms`: TE launches the
GEMMs of a set_sm_margin overlap on sm_count - num_sm SMs for their whole length,
`sim.models.compute.ComputeModel.math_units`); what it loses to NCCL's SMs beside it (data,
pipeline or context parallel traffic) is the interference model's, on top (`in_margin`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from traces.model import DTYPE_BYTES, QUANTIZED
from traces.ops import Op, OpKind, OpRow, Phase, Stream, op_row, stamp
from traces.plan.nodes import Node
from traces.purpose import (
    GemmChunk,
    GemmPart,
    Kernel,
    KernelRun,
    OverlapMethod,
    TpChunk,
    TpSite,
    Unit,
)

K = Kernel
OVERLAPPED = frozenset({K.QKV, K.PROJ, K.FC1, K.FC2})
"""The kernels whose TP collectives Transformer Engine overlaps (the layers' linear layers)."""
# TE's get_default_config: num_splits 4 for pipeline (t for ring exchange); num_sm 16 with
# set_sm_margin for pipeline and bulk (the GEMM runs on that many SMs fewer); ring exchange
# num_sm 1, use_ce, no margin (the copy engines move the data).
PIPELINE_SPLITS = 4
PIPELINE_SMS = 16
BULK_SMS = 16
RING_SMS = 0


LAUNCH = 0
"""In a template's dependencies: the compute op before the region (where TE launches it);
k + 1 names the region's op k."""

Entry = tuple[OpRow, tuple[int, ...]]
"""One op of a region: its row (`traces.ops.op_row`) but layer and micro-batch, and what it
waits for (LAUNCH, or k + 1 for the region's earlier op k)."""


@dataclass(frozen=True, slots=True)
class Template:
    """The ops of one overlapped kernel, made once per distinct kernel op and instantiated per
    layer and micro-batch (a GPT-3 plan at tp 8 overlaps ~10^5 kernels of a few dozen kinds):
    its entries in order, and the index of the collective the next compute op must wait for
    (None: nothing left in flight)."""

    entries: tuple[Entry, ...]
    join: int | None = None


class Region:
    """The ops of one overlapped kernel: its nodes in order, and the collective the next
    compute op must wait for (None: nothing left in flight)."""

    __slots__ = ("nodes", "join")

    def __init__(self, template: Template, layer: int | None, microbatch: int | None,
                 unit: Unit | None, launch: Node) -> None:
        pool = [launch]  # what each dependency of the template names
        for row, deps in template.entries:  # ~10^6 of these: the common cases inline
            after = [] if not deps else [pool[deps[0]]] if len(deps) == 1 else \
                list(map(pool.__getitem__, deps))
            pool.append(Node(stamp(row, layer, microbatch), unit, after))
        self.nodes = pool[1:]
        self.join = None if template.join is None else pool[template.join + 1]


def overlap_region(node: Node, template: Template, launch: Node) -> Region:
    """The overlapped ops replacing `node`, by `template` (`overlap_template` of its op)."""
    op = node.op
    return Region(template, op.layer, op.microbatch, node.unit, launch)


def overlap_template(op: Op, before: tuple[TpSite, ...], after: tuple[TpSite, ...],
                     group: tuple[int, ...], size: float, gathered: float | None = None,
                     asynctp: bool = False, quantized: tuple[float, float] = (1.0, 1.0)
                     ) -> Template:
    """The overlapped ops replacing `op` (a qkv, proj, fc1 or fc2 op) and its TP collectives
    `before` and `after` (`traces.plan.tensor.tp_sites` with SP), over the rank's TP `group`
    (and so t), `size` the b·s·h buffer of nccl-tests' size. Depends on `op`'s fields but its
    layer and micro-batch only; `gathered` the all-gathers' buffer where it differs (FP8);
    `asynctp`: torch's AsyncTP rather than Transformer Engine's (module docstring);
    `quantized`: bytes an element of a quantized (FP8, FP4) input and weight takes as the GEMM
    reads it, scales included (`traces.fp8_recipes.Fp8Recipe.q_act`, `q_weight`)."""
    entries: list[Entry] = []
    batch, m, n, k = op.gemm
    act, wt = quantized if op.dtype in QUANTIZED else (DTYPE_BYTES[op.dtype],) * 2
    weight, inputs = batch * n * k * wt, batch * m * k * act  # each read whole by a chunk
    gather = size if gathered is None else gathered
    backward = op.phase is Phase.BWD
    if not backward and before:  # qkv, fc1 fprop: ring-exchange all-gather
        _ring(op, before[0], group, gather, GemmPart.FPROP, entries, weight)
        return Template(tuple(entries))
    if not backward and asynctp:  # proj, fc2 fprop: torch's produce-and-copy
        return _produce(op, after[0], group, size, entries, weight)
    if not backward:  # proj, fc2 fprop: pipelined reduce-scatter
        return _pipeline(op, after[0], group, size, entries, inputs)
    if not after:  # proj, fc2 backward: ring-exchange all-gather of the output gradient
        _ring(op, before[0], group, gather, GemmPart.DGRAD, entries, weight)
        entries.append((_gemm(op, GemmPart.WGRAD, 0, 1, 0), ()))
        return Template(tuple(entries))
    return _bulk(op, before[0], after[0], group, (gather, size), entries)  # qkv, fc1 backward


def _ring(op: Op, site: TpSite, group: tuple[int, ...], size: float, part: GemmPart,
          entries: list[Entry], weight: float) -> None:
    """GEMM chunk 0 on the rank's own shard; exchange k (1..t-1) moves one shard per rank
    to its ring neighbour, GEMM chunk k waits for it. Its size is stated as the all-gather
    of 1/(t-1) of every shard that delivers the same bytes (size / (t-1) gathered), which
    the executor runs; the simulator lowers it as the neighbour copy it is
    (`peer_copy`)."""
    tp = len(group)
    previous = LAUNCH
    for k in range(tp):
        gemm = _gemm(op, part, k, tp, RING_SMS, weight)
        if k:
            entries.append((_comm(op, site, k, tp, OverlapMethod.RING, size / (tp - 1), group),
                            (previous,)))
            previous = len(entries)  # the exchange just added
            entries.append((gemm, (previous,)))
        else:
            entries.append((gemm, ()))


def _pipeline(op: Op, site: TpSite, group: tuple[int, ...], size: float,
              entries: list[Entry], inputs: float) -> Template:
    """GEMM chunk k, then its reduce-scatter (size / n of the buffer) beside chunk k + 1.
    TE's pipeline chunks the weight's output rows, each chunk's GEMM reading the whole input
    (`inputs` bytes; module docstring); its shape is still stated as a token chunk."""
    n = PIPELINE_SPLITS
    for k in range(n):
        entries.append((_gemm(op, GemmPart.FPROP, k, n, PIPELINE_SMS, inputs), ()))
        entries.append((_comm(op, site, k, n, OverlapMethod.PIPELINE, size / n, group),
                        (LAUNCH, len(entries))))  # the GEMM chunk just added
    return Template(tuple(entries), len(entries) - 1)


def _produce(op: Op, site: TpSite, group: tuple[int, ...], size: float,
             entries: list[Entry], weight: float) -> Template:
    """torch's fused_matmul_reduce_scatter: t GEMM chunks on copy-engine copies (no SMs
    held); chunk k < t - 1 computes a peer's partial sum (size / t of the output), which that
    peer pulls beside the next chunks; GEMM chunk k waits for the copy its stream issued
    before it (`own_wait` for the last, the rank's own partial, which is copied nowhere).
    Each copy is stated as a pipeline reduce-scatter chunk of size / (t - 1), which delivers
    the same bytes to each rank (size / t, one partial); then the sum of the t partial sums
    (each size / t) into the rank's shard, after the last copy: memory-bound, its bytes
    (t + 1)·size / t."""
    n = len(group)
    copies: list[int] = []  # the entry number (k + 1) of each copy
    for k in range(n):
        wait = produce_wait(k, n)
        entries.append((_gemm(op, GemmPart.FPROP, k, n, 0, weight),
                        (copies[wait],) if wait is not None else ()))
        if k < n - 1:
            entries.append((_comm(op, site, k, n - 1, OverlapMethod.PRODUCE, size / (n - 1),
                                  group), (LAUNCH, len(entries))))  # the GEMM chunk just added
            copies.append(len(entries))
    total = op_row(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=str(K.TP_PARTIAL_SUM),
                   purpose=KernelRun(K.TP_PARTIAL_SUM), phase=op.phase,
                   mem_bytes=size * (n + 1) / n,
                   dtype="bf16" if op.dtype in QUANTIZED else op.dtype)
    entries.append((total, (copies[-1],)))
    return Template(tuple(entries))


def produce_wait(k: int, tp: int) -> int | None:
    """The copy (0-based) GEMM chunk `k` of a produce region waits for: copy k - 2, whose p2p
    buffer it writes, and the last chunk `own_wait`'s (None: no wait)."""
    if k == tp - 1:
        return own_wait(tp)
    return k - 2 if k >= 2 else None


def own_wait(tp: int) -> int | None:
    """The copy (0-based, of t - 1) the last GEMM chunk of a produce region waits for: torch
    runs step s (1..t-1) on the current stream when s is even, else on the backend stream,
    and the rank's own chunk on the current stream after the loop, so behind the copy of the
    last even step (none at t = 2). At even t that is copy t - 3, two before, as every other
    chunk; at odd t, copy t - 2, the last."""
    step = (tp - 1) - (tp - 1) % 2
    return step - 1 if step >= 2 else None


def _bulk(op: Op, gather: TpSite, scatter: TpSite, group: tuple[int, ...],
          size: tuple[float, float], entries: list[Entry]) -> Template:
    """The saved input's all-gather beside the input gradient; the input gradient's
    reduce-scatter beside the weight gradient, which waits for the gather."""
    entries += [(_comm(op, gather, 0, 1, OverlapMethod.BULK, size[0], group), (LAUNCH,)),
                (_gemm(op, GemmPart.DGRAD, 0, 1, BULK_SMS), ()),
                (_comm(op, scatter, 0, 1, OverlapMethod.BULK, size[1], group), (2,)),  # dgrad
                (_gemm(op, GemmPart.WGRAD, 0, 1, BULK_SMS), (1,))]  # after the gather
    return Template(tuple(entries), 2)


def _gemm(op: Op, part: GemmPart, index: int, count: int, sms: int,
          whole: float = 0.0) -> OpRow:
    """Chunk `index` of `count` of one product of `op`'s GEMM, its fields but layer and
    micro-batch: tokens (M) split as evenly as integers go; FLOPs and HBM bytes in proportion
    (the backward's halves to each product), plus the operand every chunk reads whole
    (`chunk_bytes`: `whole` its bytes); its dtype the op's (FP8 stays FP8)."""
    purpose = op.purpose
    assert isinstance(purpose, KernelRun) and purpose.kernel in OVERLAPPED, purpose
    batch, m, n, k = op.gemm
    rows = m // count + (1 if index < m % count else 0)
    share = rows / m
    if part is GemmPart.FPROP:
        shape, fraction = (batch, rows, n, k), share
    elif part is GemmPart.DGRAD:
        shape, fraction = (batch, rows, k, n), share / 2
    else:
        assert count == 1, "the weight gradient reduces over every token: one chunk"
        shape, fraction = (batch, k, n, m), 0.5
    return op_row(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=op.name,
                  purpose=GemmChunk(purpose.kernel, part, index, count, sms), phase=op.phase,
                  flops=op.flops * fraction,
                  mem_bytes=chunk_bytes(op.mem_bytes * fraction, share, whole),
                  gemm=shape, dtype=op.dtype)  # an FP8 GEMM's chunks run at the FP8 rate too


def chunk_bytes(proportional: float, share: float, whole: float) -> float:
    """HBM bytes of a GEMM chunk that does `share` of its product: its `proportional` share
    of the product's bytes, which count the operand every chunk reads whole (`whole` bytes:
    the weight, or the pipeline's input) once over all chunks, plus the rest of it, which
    this chunk's own GEMM call reads again (module docstring)."""
    return proportional + (1.0 - share) * whole


def _comm(op: Op, site: TpSite, index: int, count: int, method: OverlapMethod, size: float,
          group: tuple[int, ...]) -> OpRow:
    """A collective chunk's row but layer and micro-batch."""
    purpose = TpChunk(site.kernel, site.slot, site.grad, site.kind, site.saved, index, count,
                      method)
    return op_row(kind=site.kind, stream=Stream.TP_COMM, name="tp", purpose=purpose,
                  group=group, size_bytes=size, phase=op.phase, dtype=op.dtype)


def peer_copy(op: Op) -> bool:
    """Whether `op` is one step of copies from one peer each, lowered as such (every rank
    sends one piece to one peer and receives one, at once: `sim.collectives.direct.
    lower_exchange`), not as the all-gather or reduce-scatter whose size it states (the
    executor runs it as one: the same bytes reach each rank): Transformer Engine's ring
    exchange, and torch's AsyncTP copies, both its all-gather's (a ring here) and its
    produce's (each rank pulls the partial sum a peer computed for it)."""
    purpose = op.purpose
    return type(purpose) is TpChunk and purpose.method in _COPY_ENGINE


def copy_engine(op: Op) -> bool:
    """Whether `op` moves its bytes on the copy engines, holding no SMs: Transformer Engine's
    ring exchange (use_ce) and torch's symmetric-memory copies (AsyncTP's `copy_` from a
    peer's buffer: cudaMemcpyAsync), unlike NCCL's kernels (the interference model's)."""
    purpose = op.purpose
    return type(purpose) is TpChunk and purpose.method in _COPY_ENGINE


_COPY_ENGINE = frozenset({OverlapMethod.RING, OverlapMethod.PRODUCE})


def in_margin(op: Op) -> bool:
    """Whether `op` is a Transformer Engine collective chunk whose SMs the GEMM chunks beside
    it leave free (pipeline and bulk: num_sm with set_sm_margin, `GemmChunk.comm_sms`), so
    an interference model that counts SMs has them counted already in those GEMMs' time
    (`sim.models.compute.ComputeModel.math_units`)."""
    purpose = op.purpose
    return type(purpose) is TpChunk and purpose.method in _MARGIN


_MARGIN = frozenset({OverlapMethod.PIPELINE, OverlapMethod.BULK})


def in_region(op: Op) -> bool:
    """Whether `op` belongs to an overlapped region (a GEMM or a collective chunk)."""
    return isinstance(op.purpose, GemmChunk | TpChunk)


def region_seconds(ops: Sequence[Op], seconds: Callable[[Op], float]) -> float:
    """The length of one region (its ops in plan order, `seconds` each op's time alone) from
    its launch to its last op's end, by the dependencies `overlap_region` states: the
    closed forms of the module docstring, for any chunk times. The layout search's."""
    gemms: list[tuple[GemmChunk, float]] = []
    comms: list[float] = []
    methods: set[OverlapMethod] = set()
    for op in ops:
        if isinstance(op.purpose, GemmChunk):
            gemms.append((op.purpose, seconds(op)))
        elif isinstance(op.purpose, TpChunk):
            comms.append(seconds(op))
            methods.add(op.purpose.method)
    (method,) = methods
    if method is OverlapMethod.BULK:
        (ag, rs), (dgrad, wgrad) = comms, [t for _, t in gemms]
        return max(ag, dgrad) + max(rs, wgrad)
    if method is OverlapMethod.RING:  # GEMM chunk k (k >= 1) waits for exchange k
        times = [t for chunk, t in gemms if chunk.part is not GemmPart.WGRAD]
        tail = sum(t for chunk, t in gemms if chunk.part is GemmPart.WGRAD)
        gemm_end, comm_end = times[0], 0.0
        for g, c in zip(times[1:], comms):
            comm_end += c
            gemm_end = max(gemm_end, comm_end) + g
        return gemm_end + tail
    if method is OverlapMethod.PRODUCE:
        return _produce_seconds([t for _, t in gemms], comms)
    gemm_end = comm_end = 0.0
    for g, c in zip((t for _, t in gemms), comms):  # chunk k's collective after its GEMM
        gemm_end += g
        comm_end = max(comm_end, gemm_end) + c
    return max(gemm_end, comm_end)


def _produce_seconds(gemms: Sequence[float], copies: Sequence[float]) -> float:
    """A produce region's length (`_produce`'s dependencies): t GEMM chunks, the first t - 1
    each followed by its copy on the copy stream; GEMM k waits for `produce_wait`'s copy."""
    t = len(gemms)
    gemm_end = copy_end = 0.0
    ends: list[float] = []  # each copy's end
    for k, g in enumerate(gemms):
        wait = produce_wait(k, t)
        gemm_end = max(gemm_end, ends[wait] if wait is not None else 0.0) + g
        if k < t - 1:
            copy_end = max(copy_end, gemm_end) + copies[k]
            ends.append(copy_end)
    return max(gemm_end, copy_end)
