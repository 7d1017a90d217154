"""Rank layout: Megatron order, the seed's 16-rank groups, axes and coordinates, every rule."""

import dataclasses
import re

import pytest

from traces.errors import ConfigError
from traces.layout import Axis, Coords, Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec

MODEL = ModelSpec(layers=16, hidden=1024, heads=16, seq_len=512, vocab=32000)


def test_seed_002_groups_for_16_ranks_tp2_pp4_dp2():
    layout = Layout(tp=2, pp=4, dp=2, global_batch=8)
    assert layout.groups(Axis.TP) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13),
                                   (14, 15)]
    assert layout.groups(Axis.DP) == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14),
                                   (13, 15)]
    assert layout.groups(Axis.PP) == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]


@pytest.mark.parametrize("degrees", [dict(tp=2, pp=4, dp=2), dict(tp=4, cp=3, pp=2, dp=5),
                                     dict(tp=1, cp=2, pp=3, dp=1), dict(tp=8, pp=1, dp=1)])
def test_a_group_by_strides_is_the_group_by_moved_coordinates(degrees):
    """`group` steps by the axis's stride; the definition moves the rank's coordinates."""
    layout = Layout(**degrees, global_batch=degrees["dp"] * 4)
    for rank in range(layout.world):
        c = layout.coords(rank)
        for axis in Axis:
            assert layout.group(rank, axis) == tuple(
                layout.rank_of(c.moved(axis, i)) for i in range(layout.degree(axis)))


def test_rank_is_tp_plus_tp_times_cp_dp_pp():
    layout = Layout(tp=4, pp=3, dp=5, global_batch=5)
    for rank in range(layout.world):
        c = layout.coords(rank)
        assert rank == c.tp + 4 * (c.cp + 1 * (c.dp + 5 * c.pp))
        assert layout.rank_of(c) == rank
        assert layout.rank(tp=c.tp, cp=c.cp, dp=c.dp, pp=c.pp) == rank


def test_axes_are_an_enum_in_megatron_order_and_coords_a_frozen_value():
    assert list(Axis) == ["tp", "cp", "dp", "pp"]
    layout = Layout(tp=2, pp=3, dp=4, global_batch=4)
    c = layout.coords(19)  # 19 = 1 + 2 * (1 + 4 * 2)
    assert c == Coords(tp=1, cp=0, dp=1, pp=2)
    assert [c.along(axis) for axis in Axis] == [1, 0, 1, 2]
    assert [layout.degree(axis) for axis in Axis] == [2, 1, 4, 3]
    assert c.moved(Axis.PP, 0) == Coords(tp=1, cp=0, dp=1, pp=0)
    assert c.moved(Axis.TP, 0) == Coords(tp=0, cp=0, dp=1, pp=2)
    assert c.moved(Axis.DP, 3) == Coords(tp=1, cp=0, dp=3, pp=2)
    assert c.moved(Axis.CP, 0) == c
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.pp = 0  # type: ignore[misc]
    # every group along an axis varies that coordinate only, through its whole range
    for axis in Axis:
        group = layout.group(19, axis)
        assert [layout.coords(r).along(axis) for r in group] == list(range(layout.degree(axis)))
        assert {layout.coords(r).moved(axis, 0) for r in group} == {c.moved(axis, 0)}
    assert layout.group(19, Axis.DP) == (17, 19, 21, 23)
    assert layout.group(19, Axis.PP) == (3, 11, 19)
    assert layout.embedding_group(19) == (3, 19)


def test_virtual_stages_interleave_over_pipeline_ranks():
    layout = Layout(tp=1, pp=4, dp=1, vp=2, schedule="interleaved", global_batch=8)
    # Seed 002 §5.5: with VP 2 rank 0 holds layers 1-2 and 9-10 (0-based: 0-1 and 8-9).
    assert layout.stages_of_rank(0) == [0, 4]
    assert [list(layout.layers_of_stage(MODEL, s)) for s in (0, 4)] == [[0, 1], [8, 9]]


def test_representatives_are_one_rank_per_pipeline_rank():
    layout = Layout(tp=2, pp=4, dp=2, global_batch=8)
    assert layout.representatives() == [0, 4, 8, 12]
    assert layout.representative(15) == 12


def _match(message: str) -> str:
    return re.escape(message)


@pytest.mark.parametrize(("options", "message"), [
    (dict(pp=4, vp=2, schedule="interleaved", global_batch=2),
     "2 micro-batches are fewer than pp = 4"),
    (dict(pp=4, vp=2, schedule="interleaved", global_batch=6), "not divisible by pp = 4"),
    (dict(pp=4, vp=2, schedule="1f1b", global_batch=8), "vp: 2 > 1 needs schedule"),
    (dict(pp=4, vp=1, schedule="interleaved", global_batch=8), "needs vp >= 2"),
    (dict(pp=1, vp=2, schedule="interleaved", global_batch=8), "parallel.pp: 1; the interleaved"),
    (dict(dp=4, micro_batch=2, global_batch=12), "global_batch: 12 is not divisible"),
    (dict(sp=True, global_batch=1), "sequence parallelism needs tp > 1"),
    (dict(zero=4, global_batch=1), "parallel.zero: 4 must be 0, 1, 2 or 3"),
    (dict(cp=2, cp_comm="ring", global_batch=1), "parallel.cp_comm: 'ring' is not one of p2p"),
    (dict(pp=4, pp_first_layers=-1), "parallel.pp_first_layers: -1 must be"),
    (dict(pp=1, pp_last_layers=3), "parallel.pp_last_layers: 3 needs pp >= 2"),
    (dict(pp=2, vp=2, schedule="interleaved", global_batch=2, pp_first_layers=3),
     "parallel.pp_first_layers: 3 is not divisible by vp = 2"),
    (dict(pp=2, pp_first_layers=True), "parallel.pp_first_layers: True must be"),
    # issue 6: floats and bools are not integers, lists are not choices, sizes are bounded
    (dict(zero=1.0), "parallel.zero: 1.0 must be 0, 1, 2 or 3"),
    (dict(zero=True), "parallel.zero: True must be 0, 1, 2 or 3"),
    (dict(tp=2.0), "parallel.tp: 2.0 must be an integer"),
    (dict(pp=True), "parallel.pp: True must be an integer"),
    (dict(dp=0), "parallel.dp: 0 must be an integer from 1 to 131,072"),
    (dict(global_batch=10**400), "parallel.global_batch: 1000000000...00000000000 must be an "
                                 "integer from 1 to 16,777,216"),
    (dict(sp="yes"), "parallel.sp: 'yes' must be true or false"),
    (dict(overlap_grad_reduce=1), "parallel.overlap_grad_reduce: 1 must be true or false"),
    (dict(fp32_main_grads="yes"), "parallel.fp32_main_grads: 'yes' must be true or false"),
    (dict(tp_comm_overlap=1), "parallel.tp_comm_overlap: 1 must be true or false"),
    (dict(overlap_param_gather="true"),
     "parallel.overlap_param_gather: 'true' must be true or false"),
    (dict(tp=2, tp_comm_overlap=True), "parallel.tp_comm_overlap: true at tp = 2 needs sp = "
                                       "true"),
    (dict(schedule=["1f1b"]), "parallel.schedule: ['1f1b'] is not one of gpipe, 1f1b"),
    (dict(recompute={"a": 1}), "parallel.recompute: {'a': 1} is not one of none"),
    (dict(bucket_bytes=10**400), "parallel.bucket_bytes: 1000000000...00000000000 must be from"),
    (dict(bucket_bytes=0), "parallel.bucket_bytes: 0 must be from 1 to"),
    (dict(tp=8, pp=64, dp=512, global_batch=512), "= 262,144 ranks, more than the 131,072"),
])
def test_a_layout_obeys_its_own_rules_once_constructed(options, message):
    with pytest.raises(ConfigError, match=_match(message)):
        Layout(**options)


ODD_VOCAB = ModelSpec(layers=16, hidden=2048, heads=32, seq_len=512, vocab=32008)
ODD_SEQ = ModelSpec(layers=16, hidden=1024, heads=16, seq_len=511, vocab=32000)


@pytest.mark.parametrize(("model", "layout", "world", "message"), [
    (MODEL, dict(tp=8, pp=16, dp=8, global_batch=1536), 512,
     "= 1024 ranks, but the cluster has 512"),
    (MODEL, dict(tp=3, global_batch=1), 3, "parallel.tp: 3 does not divide model.hidden = 1024"),
    (MODEL, dict(tp=32, global_batch=1), 32, "parallel.tp: 32 does not divide model.heads = 16"),
    (ODD_VOCAB, dict(tp=16, global_batch=1), 16,
     "parallel.tp: 16 must divide model.ffn_hidden (8192) and model.vocab (32008)"),
    (MODEL, dict(pp=3, global_batch=3), 3, "model.layers: 16 is not divisible by pp x vp"),
    (MODEL, dict(pp=4, vp=8, schedule="interleaved", global_batch=4), 4, "pp x vp = 4 x 8 = 32"),
    (ODD_SEQ, dict(tp=2, sp=True, global_batch=1), 2,
     "parallel.sp: model.seq_len = 511 is not divisible"),
    (MODEL, dict(tp=16, global_batch=1), 16, "parallel.tp: 16 is larger than a node (8 GPUs)"),
])
def test_layout_and_model_and_cluster_are_checked_together(model, layout, world, message):
    with pytest.raises(ConfigError, match=_match(message)):
        check_layout(model, Layout(**layout), world=world, devices_per_server=8)


def test_bad_enum_strings_are_config_errors():
    with pytest.raises(ConfigError, match="parallel.schedule: 'zigzag' is not one of"):
        Layout(schedule="zigzag")
    with pytest.raises(ConfigError, match="parallel.recompute: 'some' is not one of"):
        Layout(recompute="some")


def test_tp_groups_straddling_nodes_only_give_a_note():
    model = ModelSpec(layers=4, hidden=96, heads=6, seq_len=64, vocab=96)
    notes = check_layout(model, Layout(tp=6, dp=2, global_batch=2), world=12,
                         devices_per_server=8)
    assert len(notes) == 1 and "some TP groups cross nodes" in notes[0]
    assert check_layout(model, Layout(tp=2, dp=6, global_batch=6), world=12,
                        devices_per_server=8) == ()


def test_126_layers_run_on_16_stages_with_lighter_ends():
    model = ModelSpec(layers=126, hidden=64, heads=4, seq_len=64, vocab=64)
    layout = Layout(pp=16, pp_first_layers=7, pp_last_layers=7)
    check_layout(model, layout)
    assert [len(layout.layers_of_stage(model, k)) for k in range(16)] == [7] + [8] * 14 + [7]
    assert [layout.layers_of_stage(model, k)[0] for k in (0, 1, 15)] == [0, 7, 119]


@pytest.mark.parametrize(("first", "last"), [(2, 2), (4, 0), (0, 2)])
def test_uneven_interleaved_stages_follow_megatron_cores_layer_offsets(first, last):
    """megatron/core/transformer/transformer_block.py, get_num_layers_to_build and the
    offset of (pipeline rank p, virtual rank v) with an uneven first/last stage: chunks of
    first/vp and last/vp layers on the end ranks, the rest split evenly over the others."""
    pp, vp = 4, 2
    middle_ranks = pp - (first > 0) - (last > 0)
    model = ModelSpec(layers=first + last + 2 * vp * middle_ranks, hidden=64, heads=4,
                      seq_len=64, vocab=64)
    layout = Layout(pp=pp, vp=vp, schedule="interleaved", global_batch=4,
                    pp_first_layers=first, pp_last_layers=last)
    check_layout(model, layout)
    f, l, m = first // vp, last // vp, 2  # noqa: E741 - Megatron's names
    per_rank = [f if p == 0 and first else l if p == pp - 1 and last else m for p in range(pp)]
    total = sum(per_rank)  # layers in one virtual chunk of every rank
    for v in range(vp):
        for p in range(pp):
            offset = v * total + sum(per_rank[:p])
            assert layout.layers_of_stage(model, v * pp + p) == range(offset,
                                                                      offset + per_rank[p])
    covered = [i for k in range(pp * vp) for i in layout.layers_of_stage(model, k)]
    assert sorted(covered) == list(range(model.layers))
def test_the_overlaps_are_accepted_where_they_change_nothing_and_left_out_of_files_when_off():
    assert Layout(tp_comm_overlap=True).tp_comm_overlap  # tp = 1: nothing to overlap
    assert Layout(zero=0, dp=2, global_batch=2, overlap_param_gather=True).overlap_param_gather
    assert "tp_comm_overlap" not in Layout().to_dict()
    assert "overlap_param_gather" not in Layout().to_dict()
    on = Layout(tp=2, sp=True, tp_comm_overlap=True, overlap_param_gather=True).to_dict()
    assert on["tp_comm_overlap"] and on["overlap_param_gather"]
    assert Layout(**on) == Layout(tp=2, sp=True, tp_comm_overlap=True, overlap_param_gather=True)


def test_the_axes_label_names_every_degree_above_one_and_multiplies_to_the_world():
    """The label the summary and the report print: CP, VP, EP, ETP only where above 1, so
    the degrees shown multiply to the GPUs (the report once left CP out)."""
    assert Layout(tp=4, pp=4, dp=2, global_batch=8).axes() == "TP 4 · PP 4 · DP 2"
    cp = Layout(tp=4, cp=2, pp=4, dp=2, vp=5, schedule="interleaved", global_batch=128)
    assert cp.axes() == "TP 4 · CP 2 (p2p) · PP 4 · DP 2 · VP 5"
    assert Layout(tp=2, dp=4, ep=8, global_batch=4).axes() == "TP 2 · PP 1 · DP 4 · EP 8"
