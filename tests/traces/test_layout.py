"""Rank layout: Megatron order, the seed's 16-rank groups, folding symmetry, every rule."""

import warnings

import pytest

from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec

MODEL = ModelSpec(layers=16, hidden=1024, heads=16, seq_len=512, vocab=32000)


def test_seed_002_groups_for_16_ranks_tp2_pp4_dp2():
    layout = Layout(tp=2, pp=4, dp=2, global_batch=8)
    assert layout.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13),
                                   (14, 15)]
    assert layout.groups("dp") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14),
                                   (13, 15)]
    assert layout.groups("pp") == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]


def test_rank_is_tp_plus_tp_times_cp_dp_pp():
    layout = Layout(tp=4, pp=3, dp=5, global_batch=5)
    for rank in range(layout.world):
        c = layout.coords(rank)
        assert rank == c["tp"] + 4 * (c["cp"] + 1 * (c["dp"] + 5 * c["pp"]))
        assert layout.rank(**c) == rank


def test_virtual_stages_interleave_over_pipeline_ranks():
    layout = Layout(tp=1, pp=4, dp=1, vp=2, schedule="interleaved", global_batch=8)
    # Seed 002 §5.5: with VP 2 rank 0 holds layers 1-2 and 9-10 (0-based: 0-1 and 8-9).
    assert layout.stages_of_rank(0) == [0, 4]
    assert [list(layout.layers_of_stage(MODEL, s)) for s in (0, 4)] == [[0, 1], [8, 9]]


def test_representatives_and_their_copies():
    layout = Layout(tp=2, pp=4, dp=2, global_batch=8)
    assert layout.representatives() == [0, 4, 8, 12]
    assert layout.representative(15) == 12
    assert layout.copies((0, 1)) == [(2, 3)]  # the TP group's image in the other replica
    assert layout.copies((0, 2)) == [(1, 3)]  # the DP group's image for the other TP rank
    assert sorted(layout.copies((0, 4))) == [(1, 5), (2, 6), (3, 7)]  # a pipeline pair


@pytest.mark.parametrize(("layout", "world", "message"), [
    (Layout(tp=8, pp=16, dp=8, global_batch=1536), 512, "= 1024 ranks, but the cluster has 512"),
    (Layout(tp=3, global_batch=1), 3, "parallel.tp: 3 does not divide model.hidden = 1024"),
    (Layout(tp=32, global_batch=1), 32, "parallel.tp: 32 does not divide model.heads = 16"),
    (Layout(pp=3, global_batch=3), 3, "model.layers: 16 is not divisible by pp x vp"),
    (Layout(pp=4, vp=8, schedule="interleaved", global_batch=4), 4, "pp x vp = 4 x 8 = 32"),
    (Layout(pp=4, vp=2, schedule="interleaved", global_batch=2), 4,
     "2 micro-batches are fewer than pp = 4"),
    (Layout(pp=4, vp=2, schedule="interleaved", global_batch=6), 4, "not divisible by pp = 4"),
    (Layout(pp=4, vp=2, schedule="1f1b", global_batch=8), 4, "vp: 2 > 1 needs schedule"),
    (Layout(pp=4, vp=1, schedule="interleaved", global_batch=8), 4, "needs vp >= 2"),
    (Layout(dp=4, micro_batch=2, global_batch=12), 4, "global_batch: 12 is not divisible"),
    (Layout(sp=True, global_batch=1), 1, "sequence parallelism needs tp > 1"),
    (Layout(zero=4, global_batch=1), 1, "parallel.zero: 4 must be 0, 1, 2 or 3"),
    (Layout(cp=2, global_batch=1), 2, "parallel.cp: 2 is not supported"),
    (Layout(tp=16, global_batch=1), 16, "parallel.tp: 16 is larger than a node (8 GPUs)"),
])
def test_invalid_layouts_name_the_value_and_the_rule(layout, world, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layout.validate(MODEL, world=world, devices_per_server=8)


def test_bad_enum_strings_are_config_errors():
    with pytest.raises(ConfigError, match="parallel.schedule: 'zigzag' is not one of"):
        Layout(schedule="zigzag")
    with pytest.raises(ConfigError, match="parallel.recompute: 'some' is not one of"):
        Layout(recompute="some")


def test_tp_groups_straddling_nodes_only_warn():
    model = ModelSpec(layers=4, hidden=96, heads=6, seq_len=64, vocab=96)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Layout(tp=6, dp=2, global_batch=2).validate(model, world=12, devices_per_server=8)
    assert len(caught) == 1 and "some TP groups cross nodes" in str(caught[0].message)


def test_params_on_rank_add_up_to_the_model():
    layout = Layout(tp=1, pp=4, dp=1, global_batch=4)
    total = sum(layout.params_on_rank(MODEL, r) for r in range(4))
    # the last stage keeps its own copy of the tied word embeddings (Megatron, pp > 1)
    assert total == MODEL.num_params() + MODEL.vocab * MODEL.hidden
    single = Layout(global_batch=1)
    assert single.params_on_rank(MODEL, 0) == MODEL.num_params()  # pp = 1: one tensor
