"""Folding by identity: which ranks run alike, decided from the layout's inputs, not assumed.

    fold = partition(layout)                          # today's fold: one rank per (cp, pp)
    fold = partition(layout, key=speeds.__getitem__)  # a named slow node folds apart
    fold = partition(layout, key=lambda r: r)         # every rank its own class: unfolded
    fold = partition_for(model, layout, speeds)       # what `simulate` folds by

A rank's identity starts from its key: its (pp, cp) coordinate (its program), plus whatever
`key(rank)` returns (its device's speed class, its experts' token counts under skewed routing).
Ranks that start alike may still run differently, because they meet different peers: a fast
rank whose TP peer or pipeline neighbour is slow waits for it. So the classes are refined until
they are *equitable* (colour refinement): two ranks stay in one class only if, for every group
they communicate in (TP, CP, DP x CP, their pipeline, and for an MoE model EP, ETP and
expert-DP), the classes of that group's members are
the same multiset (the pipeline: the same sequence by stage). Ranks of one equitable class see
the same arrivals at every meeting and so run the same step; one representative (the least
rank) is simulated per class, a meeting needs one arrival per representative present, and the
flows of the groups the representatives do not hold are added as copies where they share links
(`traces.symmetry.copies`, by the shifts that keep every member in its class; an expert
group's by the groups of its kind whose members are in the same classes).

`partition_for` is the fold `simulate` runs: by device speed and, under skewed routing (or
balanced routing whose tokens do not split evenly over the experts), by
each rank's expert token counts (`traces.moe.expert_loads`: per MoE layer of its stage, from
the seeded routing, never by building the rank's program), so EP ranks with equal counts fold
together and the others apart, and by network position on a fat tree whose leaves the layout's
blocks cut unevenly (`sim.engine.position`: how far a rank's pipeline neighbours are, how many
of each group's members share its server, leaf and pod). Elsewhere the copies' flows on the
representatives' links stand for the rest (`with_copies`). Under ECMP each copy's flows keep
their own hashed links, and the set moves at the pace of the worst copy: an approximation.

Where nothing sets ranks apart and the cluster is alike under a cp shift, `simulate` folds
over CP too (`traces.cp_fold`: one rank per (cp mod step, pp)).

The refinement costs O(rounds x world x groups per rank), each group's view made once a round;
without a key the (cp, pp) classes are already equitable (every tp x dp shift maps the layout
onto itself) and none is done.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from traces.expert_grid import grid_kinds, shift_closed
from traces.header import FoldClasses, TraceMeta
from traces.layout import Axis, Layout
from traces.mirror_fold import mirror_rank, mirrored
from traces.model import ModelSpec
from traces.moe import distinct_experts, expert_loads

IdentityKey = Callable[[int], Hashable]
"""What sets a rank apart beyond its (cp, pp) coordinate; equal keys (and peers) fold together."""


@dataclass(frozen=True, slots=True)
class Partition:
    """The ranks of `layout` in classes; `rep_of[r]` is the representative (least rank) of r's
    class. Empty `rep_of`: the uniform fold, one class per (cp, pp) (`Layout.representative`),
    whose copies `traces.symmetry` finds fast."""

    layout: Layout
    rep_of: tuple[int, ...] = ()
    cp_step: int = 0
    """The cp shift that maps the classes onto themselves (`traces.cp_fold`); 0: cp is not
    folded, every class holds one cp coordinate."""
    mirror: bool = False
    """DualPipe's mirror pairs folded too (`traces.mirror_fold`): only the classes with
    pp < pp/2 are simulated, each standing for its own and its mirror class."""

    @property
    def uniform(self) -> bool:
        return not self.rep_of

    @property
    def world(self) -> int:
        return self.layout.world

    def representative(self, rank: int) -> int:
        if self.mirror and mirrored(self.layout, rank):
            rank = mirror_rank(self.layout, rank)
        return self.rep_of[rank] if self.rep_of else self.layout.representative(rank)

    def representatives(self) -> list[int]:
        reps = sorted(set(self.rep_of)) if self.rep_of else self.layout.representatives()
        return [r for r in reps if not mirrored(self.layout, r)] if self.mirror else reps

    def class_sizes(self) -> dict[int, int]:
        """Per representative, how many ranks it stands for."""
        sizes: dict[int, int] = {}
        for r in range(self.world):
            rep = self.representative(r)
            sizes[rep] = sizes.get(rep, 0) + 1
        return sizes

    def classes(self) -> FoldClasses | None:
        """The classes a trace's header records (`TraceMeta.fold_classes`); None for the
        uniform fold, which the header's `fold` states. Not for a mirror fold, whose plan
        holds half the representatives (`sim.engine.mirror_fold`)."""
        assert not self.mirror, "a trace holds every representative: no mirror fold"
        return FoldClasses(self.rep_of, self.cp_step) if self.rep_of else None

    @property
    def folds(self) -> bool:
        """Whether some representative stands for other ranks (False: every rank its own)."""
        return len(self.representatives()) < self.world


def recorded_fold(meta: TraceMeta) -> Layout | Partition | None:
    """The fold a plan was simulated with, as its header records it: the classes of a fold by
    identity (`meta.fold_classes`, on the meta's layout), else the uniform fold `meta.fold`
    (None: a plan of every rank, or of some ranks that mirror the absent ones)."""
    folded = meta.folded_by
    if not isinstance(folded, FoldClasses):
        return folded
    assert meta.layout is not None, "the header's reader checks classes against a layout"
    return Partition(meta.layout, folded.rep_of, folded.cp_step)


def partition_for(model: ModelSpec, layout: Layout,
                  speeds: Mapping[int, float] | None = None,
                  positions: Sequence[Hashable] | None = None) -> Partition:
    """The fold of `model` on `layout` by what sets ranks apart: `speeds` (1 where absent),
    the ranks' network `positions` (`sim.engine.position`: None where all sit alike) and, where
    EP ranks' expert work differs (`traces.moe.distinct_experts`), the experts' loads. The
    uniform fold when nothing does and the expert grid is closed under the shifts
    (`traces.expert_grid.shift_closed`)."""
    moe = model.experts > 0
    skewed = distinct_experts(model, layout)
    if speeds is None and positions is None and not skewed and \
            (not moe or shift_closed(layout)):
        return Partition(layout)
    loads: dict[tuple[int, int], tuple[tuple[int, ...], ...]] = {}

    def key(r: int) -> Hashable:
        speed = speeds.get(r, 1.0) if speeds is not None else 1.0
        place = positions[r] if positions is not None else None
        if not skewed:
            return speed, place
        at = (layout.coords(r).pp, r % (layout.tp * layout.cp * layout.dp))
        if at not in loads:
            loads[at] = expert_loads(model, layout, r)
        return speed, place, loads[at]

    return partition(layout, key, moe=moe)


def partition(layout: Layout, key: IdentityKey | None = None, *, moe: bool = False
              ) -> Partition:
    """The coarsest equitable partition of `layout`'s ranks refining (pp, cp, key(rank)); `moe`:
    the ranks also meet in their expert groups (`traces.expert_grid`)."""
    if key is None:
        return Partition(layout)
    world = layout.world
    start = [(layout.coords(r).pp, layout.coords(r).cp, key(r)) for r in range(world)]
    labels = _labels(start)
    kinds = _kinds(layout, moe)
    while True:
        # each group's view once, named by a small integer (a DP group of 1,024 is hashed
        # once per round, not once per member)
        seen = [(kind, _labels([_view(labels, g, kind.ordered) for g in kind.groups]))
                for kind in kinds]
        signature = [(labels[r], *(views[kind.index[r]] for kind, views in seen))
                     for r in range(world)]
        refined = _labels(signature)
        if max(refined) == max(labels):  # no class split: equitable
            break
        labels = refined
    first: dict[int, int] = {}
    return Partition(layout, tuple(first.setdefault(label, r) for r, label in enumerate(labels)))


def _labels(values: Sequence[Hashable]) -> list[int]:
    """Dense labels, 0 for the first distinct value met, 1 for the next, ..."""
    names: dict[Hashable, int] = {}
    return [names.setdefault(v, len(names)) for v in values]


def _view(labels: list[int], group: tuple[int, ...], ordered: bool) -> tuple[int, ...]:
    """What a member sees of its group: its members' classes, by position (a pipeline's
    stages) or as a multiset (a collective's members)."""
    seen = [labels[r] for r in group]
    return tuple(seen) if ordered else tuple(sorted(seen))


@dataclass(frozen=True, slots=True)
class _Kind:
    """The groups of one kind (every rank is in exactly one), each rank's index among them,
    and whether their members are seen by position."""

    groups: list[tuple[int, ...]]
    index: list[int]
    ordered: bool


def _kind(world: int, group_of: Callable[[int], tuple[int, ...]], ordered: bool) -> _Kind:
    index = [-1] * world
    groups: list[tuple[int, ...]] = []
    for r in range(world):
        if index[r] < 0:
            group = group_of(r)
            for m in group:
                index[m] = len(groups)
            groups.append(group)
    return _Kind(groups, index, ordered)


def _kinds(layout: Layout, moe: bool) -> list[_Kind]:
    """The groups a rank communicates in, per axis: TP, CP, its pipeline (by stage), DP x CP,
    and with `moe` the expert grid's, whose members are seen by position (their EP coordinate
    sets their experts)."""
    world = layout.world
    out = []
    for axis, ordered in ((Axis.TP, False), (Axis.CP, False), (Axis.PP, True)):
        if layout.degree(axis) > 1:
            out.append(_kind(world, partial(_axis_group, layout, axis), ordered))
    if layout.data_degree > 1:
        out.append(_kind(world, layout.data_group, False))
    if moe:
        for grid in grid_kinds(layout):
            out.append(_kind(world, partial(grid, layout), True))
    return out


def _axis_group(layout: Layout, axis: Axis, rank: int) -> tuple[int, ...]:
    return layout.group(rank, axis)


__all__ = ["IdentityKey", "Partition", "partition", "partition_for", "recorded_fold"]
