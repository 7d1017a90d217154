"""overlap_param_gather under the interleaved schedule: Megatron-Core's aligned gathers
(traces.plan.param_gather), each model chunk's dispatched at once by the schedule."""

from __future__ import annotations

import pytest

from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Phase, Stream
from traces.pipeline import layout_schedule
from traces.plan import build
from traces.purpose import ParamGather

MODEL = ModelSpec(layers=12, hidden=256, heads=4, seq_len=128, vocab=1024)
LAYOUT = Layout(pp=2, vp=3, dp=2, zero=1, schedule="interleaved", global_batch=8,
                bucket_bytes=2**20, overlap_param_gather=True)


@pytest.mark.parametrize("pp_rank", [0, 1])
def test_each_chunk_is_gathered_at_once_chunks_0_and_1_first(pp_rank: int) -> None:
    """Chunks 0 and 1 at the step's start, chunk 2 before the forward of virtual micro-batch
    pp - r; each chunk's gathers together, chunk after chunk on the DP stream."""
    rank = LAYOUT.rank(pp=pp_rank)
    ops = build(MODEL, LAYOUT, ranks=[rank]).ops[rank]
    gathers = [i for i, op in enumerate(ops) if isinstance(op.purpose, ParamGather)]
    compute = [i for i, op in enumerate(ops) if op.stream == Stream.COMPUTE]
    stages = LAYOUT.stages_of_rank(pp_rank)
    chunk_of_layer = {layer: c for c, stage in enumerate(stages)
                      for layer in LAYOUT.layers_of_stage(MODEL, stage)}
    # each gather's chunk: the chunk of the layers whose first forward op waits for it
    chunk_of: dict[int, int] = {}
    for i in compute:
        op = ops[i]
        for d in op.deps:
            if d in gathers and op.phase is Phase.FWD:
                layer = op.layer if op.layer is not None else (0 if pp_rank == 0 else None)
                chunk_of.setdefault(d, chunk_of_layer.get(layer, 0) if layer is not None
                                    else len(stages) - 1)
    assert sorted(chunk_of) == gathers  # every gather has its first forward use
    assert [chunk_of[g] for g in gathers] == sorted(chunk_of[g] for g in gathers)
    # chunks 0 and 1: before any compute op, waiting for nothing
    early = [g for g in gathers if chunk_of[g] < 2]
    assert all(g < compute[0] and not ops[g].deps for g in early)
    # chunk 2: right after the compute op before the first compute op of the rank's forward
    # of virtual micro-batch (2 - 1)·pp - r, and waiting for it
    actions = layout_schedule(LAYOUT)[pp_rank]
    forward = [a for a, action in enumerate(actions) if action.kind == "F"][LAYOUT.pp - pp_rank]
    late = [g for g in gathers if chunk_of[g] == 2]
    assert late
    opening = min(i for i in compute if ops[i].microbatch == actions[forward].microbatch
                  and ops[i].phase is Phase.FWD
                  and chunk_of_layer.get(ops[i].layer, -1) == actions[forward].stage // LAYOUT.pp)
    before = max(i for i in compute if i < opening)
    assert all(before < g < opening for g in late)
    assert all(before in ops[g].deps for g in late)
