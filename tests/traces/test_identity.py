"""Folding by identity: the classes (equitable refinement of pp, cp and the key), and the copies
a class stands for."""

import pytest

from traces.identity import partition
from traces.layout import Axis, Layout
from traces.symmetry import copies


def slow_node(node: int, per_node: int = 8):
    return lambda r: 1.5 if r // per_node == node else 1.0


def test_without_a_key_the_fold_is_one_rank_per_cp_and_pp():
    layout = Layout(tp=2, cp=2, pp=2, dp=2, global_batch=8)
    fold = partition(layout)
    assert fold.uniform and fold.representatives() == layout.representatives()
    assert [fold.representative(r) for r in range(16)] == \
        [layout.representative(r) for r in range(16)]


def test_a_uniform_key_gives_the_same_classes_and_the_same_copies():
    layout = Layout(tp=2, pp=2, dp=4, global_batch=8)
    fold = partition(layout, key=lambda r: 1.0)
    assert not fold.uniform and fold.representatives() == layout.representatives()
    for axis in (Axis.TP, Axis.DP, Axis.PP):
        for group in layout.groups(axis):
            assert copies(layout, group, fold.rep_of) == copies(layout, group)


def test_a_slow_node_folds_apart_and_so_do_the_ranks_that_wait_for_it():
    # tp 2 x dp 8 x pp 2 = 32 ranks, 4 nodes; node 1 (ranks 8-15) holds stage 0 of dp 4-7.
    layout = Layout(tp=2, pp=2, dp=8, global_batch=16)
    fold = partition(layout, key=slow_node(1))
    # stage 0 fast, stage 0 slow, stage 1 after a fast stage 0, stage 1 after the slow one
    assert fold.representatives() == [0, 8, 16, 24]
    assert fold.class_sizes() == {0: 8, 8: 8, 16: 8, 24: 8}
    assert {fold.representative(r) for r in range(24, 32)} == {24}
    # the slow class's TP groups stand for the slow ranks' only, the fast class's for the fast
    assert copies(layout, (0, 1), fold.rep_of) == [(2, 3), (4, 5), (6, 7)]
    assert copies(layout, (8, 9), fold.rep_of) == [(10, 11), (12, 13), (14, 15)]
    # a DP group holds both stage-0 classes; its copy is the other TP rank's DP group
    dp_group = layout.group(0, Axis.DP)
    assert copies(layout, dp_group, fold.rep_of) == [tuple(r + 1 for r in dp_group)]


def test_a_fast_rank_whose_tp_peer_is_slow_is_not_a_fast_rank():
    # TP 16 over two nodes, dp 2: the TP group of dp 0 spans the slow node 1, dp 1's does not;
    # and dp 1's ranks meet dp 0's in DP pairs (t, 16 + t): with a fast or with a slow one
    layout = Layout(tp=16, dp=2, global_batch=2)
    fold = partition(layout, key=slow_node(1))
    assert fold.representatives() == [0, 8, 16, 24]
    assert [fold.representative(r) for r in (7, 15, 23, 31)] == [0, 8, 16, 24]


def test_every_rank_its_own_key_is_the_unfolded_run():
    layout = Layout(tp=2, pp=2, dp=2, global_batch=4)
    fold = partition(layout, key=lambda r: r)
    assert fold.representatives() == list(range(8)) and not fold.folds
    assert all(copies(layout, g, fold.rep_of) == [] for g in layout.groups(Axis.DP))


@pytest.mark.parametrize("dp", [4, 16])
def test_refinement_stops_at_the_coarsest_equitable_classes(dp):
    layout = Layout(pp=4, dp=dp, global_batch=4 * dp)
    fold = partition(layout, key=lambda r: 1.5 if r == 0 else 1.0)  # one slow GPU
    # its pipeline: one class per stage; every other pipeline: one class per stage
    assert len(fold.representatives()) == 2 * 4
    assert fold.class_sizes()[0] == 1
