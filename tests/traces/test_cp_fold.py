"""`traces.cp_fold`: the classes by (cp mod step, pp), the renaming of a receive from an
absent CP peer onto the representative's own send, and the cp shifts in the copies."""

from traces.cp_fold import canonical_transfer, cp_partition, cp_shift, cp_shift_closed
from traces.layout import Layout
from traces.symmetry import copies


def layout(tp: int, cp: int, pp: int, dp: int, ep: int = 1) -> Layout:
    return Layout(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, global_batch=4 * dp * pp)


def test_the_classes_are_cp_mod_step_and_pp():
    lay = layout(2, 8, 2, 1)  # rank = tp + 2·(cp + 8·pp)
    fold = cp_partition(lay, 4)
    assert fold.representatives() == [0, 2, 4, 6, 16, 18, 20, 22]
    assert fold.representative(lay.rank(tp=1, cp=5, pp=1)) == lay.rank(cp=1, pp=1)
    assert set(fold.class_sizes().values()) == {4}  # tp 2 x cp 8/4 x dp 1


def test_a_receive_from_an_absent_peer_names_the_send_it_mirrors():
    lay = layout(1, 4, 1, 1)
    whole = cp_partition(lay, 1)        # rank 0 alone: its receive from 3 is 0 -> 1
    assert canonical_transfer(whole, 3, 0) == (0, 1)
    assert canonical_transfer(whole, 0, 1) == (0, 1)  # a present sender: unchanged
    lay8 = layout(2, 8, 1, 1)
    half = cp_partition(lay8, 4)        # cp 0..3 present: 7 -> 0 is the image of 3 -> 4
    assert canonical_transfer(half, 14, 0) == (6, 8)
    assert cp_shift(lay8, 6, 1) == 8


def test_the_copies_of_a_ring_transfer_are_the_rings_others():
    lay = layout(1, 4, 1, 2)  # two CP rings: 0-3 and 4-7
    fold = cp_partition(lay, 1)
    got = copies(lay, (0, 1), fold.rep_of, fold.cp_step)
    assert sorted(got) == [(1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7), (7, 4)]
    assert copies(lay, (0, 1), fold.rep_of) == [(4, 5)]  # without the cp shifts: the dp one


def test_the_expert_grid_is_checked_under_the_cp_shift():
    assert cp_shift_closed(layout(1, 4, 1, 2, ep=8), 1)   # EP over every CP x DP rank
    lay = layout(2, 4, 1, 1, ep=4)  # EP groups [0..3] [4..7]: cp + 1 moves ranks by 2
    assert not cp_shift_closed(lay, 1)
    assert cp_shift_closed(lay, 2)
