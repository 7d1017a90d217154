"""tp_comm_overlap in the executor: the chunked TP collectives, asynchronous on their stream.

The plan (`traces.plan.overlap`) cuts a layer GEMM into chunks along the tokens and its SP
collective into chunks beside them. Here every collective chunk is a real asynchronous call
on the plan's `tp_comm` communicator, on the plan's piece of the tensor (sequence-first
[s, b, h], so a rank's shard is a block of rows):

    ring exchange  chunk k (1..t-1) all-gathers piece k - 1 of t - 1 of every rank's shard;
                   the last chunk's completion lays the pieces out as the whole gathered tensor
    pipeline       chunk k (0..n-1) reduce-scatters piece k of n of every rank's block of rows;
                   the last chunk's completion joins this rank's pieces into its shard
    bulk           the whole collective, as Megatron-LM's inline one

A GEMM kernel's autograd computes it whole, so the executor runs each overlapped kernel once,
at the chunk whose inputs are all there (`run_at`): the forward of proj and fc2 at their first
chunk (their reduce-scatter chunks follow), the forward of qkv and fc1 and every input gradient
at their last; the weight-gradient op is then empty. So the executor moves exactly the plan's
bytes in the plan's calls and computes exactly the reference's numbers, while its GEMMs do not
overlap the communication the way Transformer Engine's chunks do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from executor import tape as tapes
from executor.comm import Comm, Handle
from executor.groups import GroupKey
from executor.kernels import KERNELS, Slot, slot
from executor.tape import Tape
from traces.ops import OpKind
from traces.purpose import GemmPart, Kernel, OverlapMethod, TpChunk

ROW_PARALLEL = frozenset({Kernel.PROJ, Kernel.FC2})
"""Overlapped kernels whose forward output is reduce-scattered (the others' input gathered)."""


def run_at(kernel: Kernel, part: GemmPart, index: int, count: int) -> bool:
    """Whether the executor runs the whole kernel at this chunk (module docstring)."""
    if part is GemmPart.WGRAD:
        return False
    if part is GemmPart.FPROP and kernel in ROW_PARALLEL:
        return index == 0
    return index == count - 1


@dataclass(slots=True)
class _Pieces:
    """One chunked collective in flight: the tensor it cuts and the chunks' outputs so far."""

    value: torch.Tensor
    outputs: list[torch.Tensor] = field(default_factory=list)


class ChunkedTp:
    """The chunked TP collectives of one rank (`RankRuntime.tp_chunk` calls `issue`)."""

    def __init__(self, comm: Comm, tp: int, num_layers: int, keep_shard: bool = True) -> None:
        self.comm, self.tp, self.num_layers = comm, tp, num_layers
        self.keep_shard = keep_shard
        """A gathered input's GEMM keeps its shard, gathered again in backward (Megatron/TE);
        False: it keeps the gathered input (DTensor: `traces.stack.regathers`)."""
        self.open: dict[tuple[int, Slot, bool], _Pieces] = {}

    def issue(self, tape: Tape, mb: int, chunk: TpChunk, layer: int | None,
              key: GroupKey) -> Handle:
        where = slot(KERNELS[chunk.kernel], chunk.slot, layer, self.num_layers)
        if chunk.method is OverlapMethod.BULK:
            return self._bulk(tape, where, chunk, key)
        state = (mb, where, chunk.grad)
        first = 1 if chunk.method is OverlapMethod.RING else 0
        if chunk.index == first:
            self.open[state] = _Pieces(self._source(tape, where, chunk))
        pieces = self.open[state]
        last = chunk.index == chunk.count - 1
        if chunk.method is OverlapMethod.RING:
            return self._ring(tape, where, chunk, pieces, key, last, state)
        return self._pipeline(tape, where, chunk, pieces, key, last, state)

    def _source(self, tape: Tape, where: Slot, chunk: TpChunk) -> torch.Tensor:
        """What the collective cuts, taken as Megatron-LM's inline site takes it (`tp`)."""
        if chunk.saved:
            return tape.acts[tapes.shard_slot(where)]
        if chunk.kind is OpKind.ALL_GATHER and not chunk.grad:
            value = tape.take(where).contiguous()
            if self.keep_shard:
                tape.put(tapes.shard_slot(where), value)  # the GEMM keeps its input's shard
            return value
        return (tape.grads if chunk.grad else tape.acts)[where].contiguous()

    def _ring(self, tape: Tape, where: Slot, chunk: TpChunk, pieces: _Pieces, key: GroupKey,
              last: bool, state: tuple[int, Slot, bool]) -> Handle:
        t = self.tp
        piece = pieces.value.tensor_split(t - 1, dim=0)[chunk.index - 1].contiguous()
        out = piece.new_empty((piece.shape[0] * t, *piece.shape[1:]))
        pieces.outputs.append(out)
        then = self._closer(tape, where, chunk, state, self._gathered) if last else None
        return self.comm.all_gather(out, piece, key, async_op=True, then=then)

    def _pipeline(self, tape: Tape, where: Slot, chunk: TpChunk, pieces: _Pieces,
                  key: GroupKey, last: bool, state: tuple[int, Slot, bool]) -> Handle:
        t, n = self.tp, chunk.count
        blocks = pieces.value.tensor_split(t, dim=0)  # rank r's rows
        part = torch.cat([b.tensor_split(n, dim=0)[chunk.index] for b in blocks]).contiguous()
        out = part.new_empty((part.shape[0] // t, *part.shape[1:]))
        pieces.outputs.append(out)
        then = self._closer(tape, where, chunk, state, lambda p: torch.cat(p.outputs)) \
            if last else None
        return self.comm.reduce_scatter(out, part, key, async_op=True, then=then)

    def _gathered(self, pieces: _Pieces) -> torch.Tensor:
        """Chunk k's output holds piece k of every rank's shard, rank by rank: the whole
        tensor is rank 0's pieces in order, then rank 1's, ..."""
        by_rank = [out.tensor_split(self.tp, dim=0) for out in pieces.outputs]
        return torch.cat([by_rank[k][r] for r in range(self.tp) for k in range(len(by_rank))])

    def _closer(self, tape: Tape, where: Slot, chunk: TpChunk, state: tuple[int, Slot, bool],
                join: Callable[[_Pieces], torch.Tensor]) -> Callable[[], None]:
        def close() -> None:
            _store(tape, where, chunk, join(self.open.pop(state)))
        return close

    def _bulk(self, tape: Tape, where: Slot, chunk: TpChunk, key: GroupKey) -> Handle:
        value = self._source(tape, where, chunk)
        t = self.tp
        if chunk.kind is OpKind.ALL_GATHER:
            out = value.new_empty((value.shape[0] * t, *value.shape[1:]))
            return self.comm.all_gather(out, value, key, async_op=True,
                                        then=lambda: _store(tape, where, chunk, out))
        assert chunk.kind is OpKind.REDUCE_SCATTER, chunk
        out = value.new_empty((value.shape[0] // t, *value.shape[1:]))
        return self.comm.reduce_scatter(out, value, key, async_op=True,
                                        then=lambda: _store(tape, where, chunk, out))


def _store(tape: Tape, where: Slot, chunk: TpChunk, out: torch.Tensor) -> None:
    if chunk.grad:
        tape.replace_grad(where, out)
    else:
        tape.put(where, out)
