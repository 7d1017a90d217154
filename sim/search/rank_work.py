"""What each pipeline rank runs per micro-batch, for the analytic step (`sim.search.analytic`).

Where every rank's chunks hold equal layer counts (an even split, or pp_first/last_layers), the
first, a middle and the last rank stand for all: rank r runs vp - 1 of its own chunks and the
one holding an end of the model. Where chunks of one rank differ (`account_for_embedding` /
`account_for_loss` with vp > 1, a `pipeline_layout`), each rank adds up its own chunks, stage by
stage (`traces.stage_split`), and the pipeline's rhythm is its largest chunk's.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.search.stage_time import ChunkPass, UnitTime, stage
from traces.layout import Layout, Schedule
from traces.model import ModelSpec


@dataclass(frozen=True, slots=True)
class RankWork:
    """One pipeline rank's seconds per micro-batch and what its last backward leaves."""

    per_microbatch: float
    """Its chunks forward and backward, and its pipeline hops."""
    last_backward: float
    """The backward of all its chunks for one micro-batch."""
    kernels: float
    """Its kernels alone, per micro-batch."""
    tail: float
    """The side-stream work its last backward unit leaves (`ChunkPass.tail`)."""


@dataclass(frozen=True, slots=True)
class PipeWork:
    chunk: ChunkPass
    """The chunk that sets the pipeline's rhythm (bubble and drain)."""
    ranks: dict[int, RankWork]
    """The ranks that differ, each with its work."""


def equal_chunks(model: ModelSpec, layout: Layout) -> bool:
    """Every rank's chunks hold the same number of layers."""
    counts = layout.stage_layers(model)
    return all(len({counts[s] for s in layout.stages_of_rank(r)}) == 1
               for r in range(layout.pp))


def pipe_work(model: ModelSpec, layout: Layout, layer: UnitTime, first: UnitTime,
              last: UnitTime, hop: float) -> PipeWork:
    """Each rank's work per micro-batch (module docstring)."""
    if equal_chunks(model, layout):
        return _equal(model, layout, layer, first, last, hop)
    return _by_stage(model, layout, layer, first, last, hop)


def _hops(layout: Layout, r: int) -> int:
    """Pipeline hops rank r waits for per micro-batch: one forward and one backward a chunk,
    but the first stage receives nothing forward and the last nothing back; none where
    Megatron-Core overlaps them (`overlap_p2p_comm` under interleaving: each send moves beside
    the other direction's chunk, `traces.plan.p2p`), which leaves them to the fill."""
    p, v = layout.pp, layout.vp
    if p == 1 or (layout.overlap_p2p_comm and layout.schedule is Schedule.INTERLEAVED):
        return 0
    return 2 * v - (r == 0) - (r == p - 1)


def _equal(model: ModelSpec, layout: Layout, layer: UnitTime, first: UnitTime,
           last: UnitTime, hop: float) -> PipeWork:
    """The first, a middle and the last rank: vp - 1 chunks of their own and one holding the
    embedding (rank 0) or the output layer (rank p-1), both on rank 0 without a pipeline."""
    p, v = layout.pp, layout.vp
    n = layout.layers_per_chunk(model, min(1, p - 1))  # a middle rank's chunk
    ranks = sorted({0, min(1, p - 1), p - 1})
    ends = {r: stage(layout.layers_per_chunk(model, r), layer,
                     *([first] if r == 0 else []), *([last] if r == p - 1 else []))
            for r in ranks}
    own = {r: stage(layout.layers_per_chunk(model, r), layer) for r in ranks}
    work = {r: RankWork(
        per_microbatch=(v - 1) * (own[r].fwd + own[r].bwd) + ends[r].fwd + ends[r].bwd
        + _hops(layout, r) * hop,
        last_backward=(v - 1) * own[r].bwd + ends[r].bwd,
        kernels=(v - 1) * layout.layers_per_chunk(model, r) * layer.kernels + ends[r].kernels,
        tail=ends[r].tail) for r in ranks}
    return PipeWork(chunk=stage(n, layer), ranks=work)


def _by_stage(model: ModelSpec, layout: Layout, layer: UnitTime, first: UnitTime,
              last: UnitTime, hop: float) -> PipeWork:
    """Every rank, each chunk with its own layer count and the ends it holds."""
    counts, final = layout.stage_layers(model), layout.num_stages - 1
    passes = [stage(n, layer, *([first] if k == 0 else []), *([last] if k == final else []))
              for k, n in enumerate(counts)]
    work = {}
    for r in range(layout.pp):
        mine = [passes[k] for k in layout.stages_of_rank(r)]
        work[r] = RankWork(per_microbatch=sum(c.fwd + c.bwd for c in mine)
                           + _hops(layout, r) * hop,
                           last_backward=sum(c.bwd for c in mine),
                           kernels=sum(c.kernels for c in mine),
                           tail=mine[0].tail)  # its first chunk's backward ends the step
    return PipeWork(chunk=stage(max(counts), layer), ranks=work)
