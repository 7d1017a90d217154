"""Folding's symmetry: `copies` against its brute-force definition, and at DP 2,048."""

import random
import time

import pytest

from traces.layout import Axis, Layout
from traces.symmetry import copies


def test_the_copies_of_the_seeds_16_rank_groups():
    layout = Layout(tp=2, pp=4, dp=2, global_batch=8)
    assert copies(layout, (0, 1)) == [(2, 3)]  # the TP group's image in the other replica
    assert copies(layout, (0, 2)) == [(1, 3)]  # the DP group's image for the other TP rank
    assert sorted(copies(layout, (0, 4))) == [(1, 5), (2, 6), (3, 7)]  # a pipeline pair


def _copies_by_every_shift(layout: Layout, group: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The definition `copies` computes by its stabilizer: try all tp x dp shifts."""
    def shift(rank: int, dtp: int, ddp: int) -> int:
        c = layout.coords(rank)
        return layout.rank(tp=(c.tp + dtp) % layout.tp, cp=c.cp, dp=(c.dp + ddp) % layout.dp,
                           pp=c.pp)

    images, seen = [], {frozenset(group)}
    for dtp in range(layout.tp):
        for ddp in range(layout.dp):
            image = tuple(shift(r, dtp, ddp) for r in group)
            if frozenset(image) not in seen:
                seen.add(frozenset(image))
                images.append(image)
    return images


def _groups(layout: Layout, rng: random.Random) -> list[tuple[int, ...]]:
    """The plan's groups, random sets, and random sets made symmetric under a random shift
    (so the stabilizer is neither everything nor nothing), some reaching past the world."""
    w = layout.world
    groups = [g for axis in (Axis.TP, Axis.DP, Axis.PP) for g in layout.groups(axis)]
    groups += [layout.embedding_group(r) for r in layout.representatives()]
    for _ in range(12):
        groups.append(tuple(rng.sample(range(w + 4), rng.randint(1, min(w, 9)))))
        seed = set(rng.sample(range(w), rng.randint(1, min(w, 4))))
        dtp, ddp = rng.randrange(layout.tp), rng.randrange(layout.dp)
        for _ in range(layout.tp * layout.dp):  # close the set under the shift
            seed |= {layout.rank(tp=(c.tp + dtp) % layout.tp, dp=(c.dp + ddp) % layout.dp,
                                 pp=c.pp) for c in map(layout.coords, seed)}
        groups.append(tuple(rng.sample(sorted(seed), len(seed))))
    return groups


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("dp", [1, 2, 4, 6, 8])
@pytest.mark.parametrize("pp", [1, 3])
def test_copies_equal_the_images_under_every_shift(tp, dp, pp):
    layout = Layout(tp=tp, dp=dp, pp=pp, global_batch=dp)
    rng = random.Random(tp * 100 + dp * 10 + pp)
    for group in _groups(layout, rng):
        assert copies(layout, group) == _copies_by_every_shift(layout, group), group


def test_copies_of_a_2048_way_dp_group_take_one_image_per_tp_shift():
    layout = Layout(tp=2, pp=2, dp=2048, global_batch=2048)
    group = layout.group(0, Axis.DP)
    start = time.perf_counter()
    images = copies(layout, group)
    assert time.perf_counter() - start < 1.0  # every shift: 8 M of them, 40 s
    assert images == [tuple(r + 1 for r in group)]
    assert len(copies(layout, layout.group(0, Axis.TP))) == 2047
