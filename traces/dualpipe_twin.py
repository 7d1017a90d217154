"""DeepSeek's two-copy DualPipe simulated as its DualPipeV twin.

Under DualPipe (`traces.dualpipe_order`) rank r and rank pp - 1 - r run the same steps, those
of DualPipeV's rank h = min(r, pp - 1 - r) of pp/2 ranks over m/2 micro-batches, on the same
two stages' layers (stage h and stage pp - 1 - h of the model's pp, one per copy): a
micro-batch of direction 0 crosses ranks 0 .. pp - 1 as DualPipeV's crosses ranks
0 .. pp/2 - 1 and back, rank pp - 1 - h standing in for rank h on the way back; direction
1 the same from the other end. So DualPipe on pp ranks and dp replicas does, rank for rank,
the work of DualPipeV on pp/2 ranks (vp = 2) and 2 dp replicas, each half of a DualPipe
pipeline a DualPipeV replica: the same layers and parameters per rank (two stages: the
README's "2x" parameters against 1F1B's one), the same micro-batches per rank, the same
gradients summed over the same 2 dp copies of each stage (DualPipe sums its two copies' and
its dp replicas'), the same world.

What the twin does not hold: the hand-over of an activation (and its gradient) from rank
pp/2 - 1 to rank pp/2 in the middle of each direction, a send over the network in DualPipe
and a local hand-over in DualPipeV's V; and the ranks' places on the cluster follow the
twin's rank order (Megatron's, `traces.layout`), not DualPipe's; with tied embeddings the
twin's rank 0 holds the word embeddings once for its first and last stage, where DualPipe's
two copies hold them twice (DeepSeek-V3 does not tie them).
"""

from __future__ import annotations

from dataclasses import replace

from traces.layout import Layout, Schedule


def dualpipe_twin(layout: Layout) -> Layout:
    """The DualPipeV layout a DualPipe layout is simulated as (module docstring); any other
    layout as it is."""
    if layout.schedule is not Schedule.DUALPIPE:
        return layout
    return replace(layout, pp=layout.pp // 2, dp=2 * layout.dp, vp=2,
                   schedule=Schedule.DUALPIPEV)


def twin_note(layout: Layout) -> str:
    """The warning a DualPipe layout's simulation carries."""
    return (f"parallel.schedule: \"dualpipe\" at pp = {layout.pp}, dp = {layout.dp} is "
            f"simulated as its DualPipeV twin (pp = {layout.pp // 2}, dp = {2 * layout.dp}, "
            "vp = 2; traces.dualpipe_twin): the middle rank's activation send is not timed")
