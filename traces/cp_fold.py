"""Folding over context parallelism: CP ranks of a stage run one program on relabelled peers.

    fold = cp_partition(layout, step)      # one rank per (cp mod step, pp): step 1, per pp

Every CP rank of a stage runs the same ops: each attention core's ring steps are costed alike
(`traces.plan.context`: half of each step's s/cp × s/cp, exact under load balancing), so the
K/V blocks, their sizes and the kernels are the same on every CP rank, and dropout's draws are
counts, equal on each.
Shifting every rank's cp coordinate by `step` (mod CP) maps each group a rank meets onto a
group of its kind: TP groups onto TP groups, the CP group and DP x CP group onto themselves,
pipelines onto pipelines, the CP ring's transfer cp -> cp + 1 onto cp + step -> cp + step + 1;
the expert grid's groups are checked (`cp_shift_closed`). So when the cluster is alike under
the shift too (`sim.engine.position.cp_fold_step` finds the least such step), ranks whose cp
coordinates are equal modulo `step` run identical steps and one stands for all.

Folded so, a rank's ring peers may be absent: the representative's receive from cp − 1 is the
image of cp + 1's receive from it, so the lowering meets it with the representative's own send
(`canonical_transfer`), which is when the unfolded run starts that transfer; the other ring
transfers' flows are added as copies where they share links (`traces.symmetry.copies` with the
cp shifts).
"""

from __future__ import annotations

from traces.expert_grid import grid_kinds
from traces.identity import Partition
from traces.layout import Layout


def cp_shift(layout: Layout, rank: int, by: int) -> int:
    """`rank` with its cp coordinate moved by `by` (mod CP), the others kept."""
    c = layout.coords(rank)
    return layout.rank(tp=c.tp, cp=(c.cp + by) % layout.cp, dp=c.dp, pp=c.pp)


def cp_shift_closed(layout: Layout, step: int) -> bool:
    """Whether the cp shift by `step` maps every expert group (EP, ETP, expert-DP) onto a group
    of its kind (as `traces.expert_grid.shift_closed` checks the tp and dp shifts)."""
    n = layout.tp * layout.cp * layout.dp
    for kind in grid_kinds(layout):
        for i in range(n):
            image = {cp_shift(layout, m, step) for m in kind(layout, i)}
            if image != set(kind(layout, cp_shift(layout, i, step))):
                return False
    return True


def cp_partition(layout: Layout, step: int) -> Partition:
    """The fold of `layout` by (cp mod `step`, pp): each rank's representative has tp = dp = 0
    and cp coordinate cp mod `step` (`step` divides CP)."""
    assert 0 < step < layout.cp and layout.cp % step == 0, "a cp fold's step divides CP"
    rep_of = []
    for r in range(layout.world):
        c = layout.coords(r)
        rep_of.append(layout.rank(cp=c.cp % step, pp=c.pp))
    return Partition(layout, tuple(rep_of), cp_step=step)


def canonical_transfer(fold: Partition, src: int, dst: int) -> tuple[int, int]:
    """The transfer `src` -> `dst` moved by the cp shift that brings `src` onto its
    representative, where `src` is absent: a representative's receive from an absent CP peer
    then names the transfer its own send makes (module docstring). Unchanged otherwise."""
    rep = fold.representative(src)
    if not fold.cp_step or rep == src:
        return src, dst
    layout = fold.layout
    by = layout.coords(rep).cp - layout.coords(src).cp
    moved = cp_shift(layout, src, by)
    if moved != rep:  # not a pure cp image (a tp or dp peer): nothing to rename
        return src, dst
    return moved, cp_shift(layout, dst, by)


__all__ = ["canonical_transfer", "cp_partition", "cp_shift", "cp_shift_closed"]
