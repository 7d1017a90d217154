"""Folding DualPipe's mirror pairs: rank pp - 1 - r runs rank r's step with the copies swapped.

    fold = mirror_partition(layout)   # one rank per (cp, pp < pp/2): half the pipeline ranks

Under `schedule = "dualpipe"` rank r holds stage r of copy 0 and stage pp-1-r of copy 1, and its
mirror holds the same two stages with the copies swapped; it runs the same step order with the
copies' halves of the micro-batches exchanged (`traces.dualpipe_order`). Op i of one equals op i
of the other once micro-batch m is renamed (m + M/2) mod M, the two copies' pipeline streams are
swapped and peers and groups are mirrored (`tests/sim/test_dualpipe_mirror.py`); layer, sizes,
FLOPs and tags are the same. So on a cluster alike under the swap
(`sim.engine.mirror_placement`) a run of the ranks with pp < pp/2 gives each mirror's op i
the same start and end as its own op i.

Folded so, the middle rank pp/2-1 meets an absent peer: its receive from pp/2 (copy 1) is the
image of its own send to pp/2 (copy 0, same tag, same position in the tag's order), so the
lowering meets it with that send (`canonical_mirror`), which is when the unfolded run starts
the pair of transfers. The absent half's flows are added as copies where they share links
(`mirror_pairs`, `mirror_groups`), and each collective the present half counts stands for its
mirror's too (`counted_for`: twice; once for the gradient reduce-scatters whose group holds
both mirrors).
See docs/dualpipe-mirror-fold.md for the preconditions.
"""

from __future__ import annotations

from collections.abc import Container

from traces.layout import Layout


def mirror_rank(layout: Layout, rank: int) -> int:
    """`rank` with its pp coordinate reflected (pp -> pp-1-pp), tp, cp and dp kept."""
    c = layout.coords(rank)
    return layout.rank(c.tp, c.cp, c.dp, layout.pp - 1 - c.pp)


def mirrored(layout: Layout, rank: int) -> bool:
    """Whether `rank` sits in the mirrored half (pp >= pp/2), whose ranks are not simulated."""
    return 2 * layout.coords(rank).pp >= layout.pp


def mirror_pairs(layout: Layout, pairs: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The mirrors of a transfer's pair and its copies: transfers between the mirrored stages,
    never one of `pairs` (the middle pair's mirror is the reverse transfer, also absent)."""
    return [tuple(mirror_rank(layout, r) for r in pair) for pair in pairs]


def mirror_groups(layout: Layout, groups: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The mirrors of a collective's group and its copies that are other sets of ranks than
    every one of them and than each other (a group holding both mirrors is its own)."""
    seen = {frozenset(g) for g in groups}
    images = []
    for g in groups:
        image = tuple(mirror_rank(layout, r) for r in g)
        if frozenset(image) not in seen:
            seen.add(frozenset(image))
            images.append(image)
    return images


def canonical_mirror(layout: Layout, present: Container[int], src: int, dst: int
                     ) -> tuple[int, int]:
    """The transfer `src` -> `dst` mirrored where `src` is absent from `present` and mirrored:
    the middle rank's receive from pp/2 names its own send to pp/2 (module docstring)."""
    if src in present or not mirrored(layout, src):
        return src, dst
    return mirror_rank(layout, src), mirror_rank(layout, dst)


def counted_for(layout: Layout, group: tuple[int, ...] | None) -> int:
    """How many of the unfolded run's collectives one the present half counts stands for: 1
    where its group is its own mirror (DualPipe's gradient reduction over both), else 2; a
    transfer (`group` None) 2: its mirror, or for the middle pair the reverse transfer."""
    if group is None:
        return 2
    return 1 if {mirror_rank(layout, r) for r in group} == set(group) else 2


__all__ = ["canonical_mirror", "counted_for", "mirror_groups", "mirror_pairs", "mirror_rank",
           "mirrored"]
