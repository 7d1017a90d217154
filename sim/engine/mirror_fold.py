"""DualPipe's mirror fold in `simulate`: replay half the pipeline ranks, copy the other half.

    mirror = mirror_fold(model, layout, cluster, classes)   # None: it may not stand
    times = unfold(replay(half(plan, mirror), ..., fold=mirror), plan, classes)

The plan keeps the fold's representatives (one rank per (cp, pp), or the identity classes);
only those with pp < pp/2 are replayed (`traces.mirror_fold`), and each mirrored rank's start
and end lists are its mirror's, unchanged (op i of one is op i of the other, relabelled). The
step's figures are then those of the fold without mirrors, from the same lists in the same
order. A mirrored rank's communication ops are its mirror's (the summary reads their indices
only; their channels name the mirror's peers).
"""

from __future__ import annotations

from dataclasses import replace

from sim.engine.mirror_placement import mirror_alike
from sim.engine.replay import StepTimes
from topology.cluster import Cluster
from traces.identity import Partition
from traces.layout import Layout, Schedule
from traces.mirror_fold import mirror_rank, mirrored
from traces.model import ModelSpec
from traces.moe import distinct_experts
from traces.ops import Trace


def mirror_fold(model: ModelSpec, layout: Layout, cluster: Cluster,
                classes: Partition | None) -> Partition | None:
    """`classes` (None: the uniform fold) with DualPipe's mirror pairs folded too, where the
    schedule is DualPipe, the cluster alike under the swap pp -> pp-1-pp (`mirror_alike`),
    every rank's expert loads alike (no skewed routing) and the classes mapped onto classes
    by the swap, not folded over CP; else None. The caller keeps device speeds and network
    positions out (they key ranks apart)."""
    if layout.schedule is not Schedule.DUALPIPE or layout.pp < 2 or \
            distinct_experts(model, layout) or not mirror_alike(cluster, layout):
        return None
    if classes is None:
        return Partition(layout, mirror=True)
    if classes.cp_step or not _swapped_onto_classes(classes):
        return None
    return replace(classes, mirror=True)


def _swapped_onto_classes(classes: Partition) -> bool:
    """Whether the swap maps each class onto a class: mirrors of one class's ranks share a
    representative, the mirror of theirs' (O(world))."""
    layout = classes.layout
    return all(classes.representative(mirror_rank(layout, r))
               == classes.representative(mirror_rank(layout, classes.representative(r)))
               for r in range(layout.world))


def half(plan: Trace, fold: Partition) -> Trace:
    """`plan` (one rank per (cp, pp)) with only the ranks the mirror fold replays."""
    keep = set(fold.representatives())
    return Trace({r: ops for r, ops in plan.ops.items() if r in keep}, plan.meta)


def unfold(times: StepTimes, plan: Trace, classes: Partition | None) -> StepTimes:
    """The replay of `half(plan)` as the replay of `plan` folded by `classes` (None: the
    uniform fold): each mirrored representative's starts, ends and communication ops are
    its mirror's."""
    assert times.fold is not None and times.fold.mirror, "a replay folded by mirrors"
    layout = times.fold.layout

    def source(rank: int) -> int:
        return mirror_rank(layout, rank) if mirrored(layout, rank) else rank

    starts = {r: times.starts[source(r)] for r in plan.ops}
    ends = {r: times.ends[source(r)] for r in plan.ops}
    comm = times.communication
    expanded = None if comm is None else {r: comm[source(r)] for r in plan.ops if
                                          source(r) in comm}
    return replace(times, plan=plan, starts=starts, ends=ends, communication=expanded,
                   fold=classes)


__all__ = ["half", "mirror_fold", "unfold"]
