"""Megatron-Core's pipeline splits (`traces.stage_split`, `traces.pipeline_layout`,
`traces.split_rules`): layers per virtual stage worked by hand from Megatron-Core's code for its
own examples and for Llama 3.1 405B's recipes, Megatron-Core's offsets equal to the running sums
of its layer counts, and every refusal one line naming the rule."""

from __future__ import annotations

import pytest

from traces.errors import ConfigError
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.split_rules import check_split
from traces.stage_split import Split, layer_offset, num_layers_to_build


def model(layers: int) -> ModelSpec:
    return ModelSpec(layers=layers, hidden=64, heads=4, seq_len=64, vocab=64)


def interleaved(pp: int, vp: int, **keys: object) -> Layout:
    return Layout(pp=pp, vp=vp, schedule="interleaved", global_batch=pp, **keys)


def counts(m: ModelSpec, layout: Layout) -> list[int]:
    check_layout(m, layout)
    return [len(layout.layers_of_stage(m, k)) for k in range(layout.num_stages)]


def test_126_layers_and_both_ends_accounted_fill_pp8_vp8_with_two_a_stage():
    """get_num_layers_to_build: (126 + 1 + 1) / 8 = 16 a rank, / 8 = 2 a virtual stage, one
    fewer on the first (vp_stage 0 of rank 0) and the last (vp_stage 7 of rank 7).
    get_transformer_layer_offset: vp_stage * 128/8 + pp_rank * 2, less one past the first
    stage: stage 8 (rank 0, chunk 1) starts at 16 - 1 = 15, stage 63 at 112 + 14 - 1 = 125."""
    m, layout = model(126), interleaved(8, 8, account_for_embedding=True,
                                        account_for_loss=True)
    assert counts(m, layout) == [1] + [2] * 62 + [1]
    assert layout.layers_of_stage(m, 0) == range(0, 1)
    assert layout.layers_of_stage(m, 1) == range(1, 3)
    assert layout.layers_of_stage(m, 8) == range(15, 17)
    assert layout.layers_of_stage(m, 63) == range(125, 126)
    assert [layout.layers_of_rank(m, r) for r in range(8)] == [15] + [16] * 6 + [15]
    with pytest.raises(ConfigError, match="126 is not divisible by pp x vp = 8 x 8"):
        check_layout(m, interleaved(8, 8))  # without the flags, as before


def test_llama3_405b_pp16_interleaved_is_one_layer_lighter_on_the_end_ranks():
    """Llama 3 (arXiv 2407.21783, §3.3.2): 126 layers on PP 16, one layer fewer on the first
    and the last stage. Megatron-Core states it with both account flags (Megatron-Bridge's
    llama31_405b recipes set account_for_embedding/loss_in_pipeline_split): 128 / 16 = 8 a
    rank; interleaved, 8 / vp a chunk, the first and last chunk one fewer. Per rank: the 7,
    8 x 14, 7 of pp_first_layers = pp_last_layers = 7, which cannot be interleaved (7 / vp)."""
    m = model(126)
    uneven = Layout(pp=16, pp_first_layers=7, pp_last_layers=7)
    check_layout(m, uneven)
    for vp in (2, 4, 8):
        layout = interleaved(16, vp, account_for_embedding=True, account_for_loss=True)
        per_chunk = 8 // vp
        assert counts(m, layout) == [per_chunk - 1] + [per_chunk] * (16 * vp - 2) + \
            [per_chunk - 1]
        assert [layout.layers_of_rank(m, r) for r in range(16)] == \
            [uneven.layers_of_rank(m, r) for r in range(16)] == [7] + [8] * 14 + [7]
    with pytest.raises(ConfigError, match="pp_first_layers: 7 is not divisible by vp = 2"):
        interleaved(16, 2, pp_first_layers=7, pp_last_layers=7)
    # Megatron-Bridge's 405B pretraining recipe: TP 8, PP 8, VP 2, CP 4, both flags
    bridge = interleaved(8, 2, account_for_embedding=True, account_for_loss=True)
    assert counts(m, bridge) == [7] + [8] * 14 + [7]


def test_the_embedding_alone_shifts_every_later_stage_by_one():
    """Only --account-for-embedding-in-pipeline-split: (7 + 1) / (2 x 2) = 2 a stage."""
    m, layout = model(7), interleaved(2, 2, account_for_embedding=True)
    assert counts(m, layout) == [1, 2, 2, 2]
    assert [layout.layers_of_stage(m, k).start for k in range(4)] == [0, 1, 3, 5]
    loss = Layout(pp=4, account_for_loss=True)  # (7 + 1) / 4 = 2, the last rank 1
    assert counts(m, loss) == [2, 2, 2, 1]


SPLITS = [Split(16, 4), Split(16, 4, 2), Split(14, 4, embedding=True, loss=True),
          Split(126, 8, 8, embedding=True, loss=True), Split(7, 2, 2, embedding=True),
          Split(15, 4, loss=True), Split(10, 4, first=1, last=1), Split(12, 4, 2, 2, 2),
          Split(10, 4, 2, 4), Split(8, 4, 2, 0, 2), Split(9, 3, last=3), Split(8, 3, 1, 2)]


@pytest.mark.parametrize("split", SPLITS, ids=str)
def test_megatron_cores_offsets_are_the_running_sums_of_its_layer_counts(split):
    """Two of Megatron-Core's functions, written apart as it writes them: the offset of
    (pp_rank, vp_stage) is the layers of every virtual stage before it."""
    check_split(split)
    built = [num_layers_to_build(split, k % split.pp, k // split.pp)
             for k in range(split.pp * split.vp)]
    assert sum(built) == split.layers and min(built) >= 0
    for k in range(split.pp * split.vp):
        assert layer_offset(split, k % split.pp, k // split.pp) == sum(built[:k]), k


def test_deepseek_v3s_layout_runs_61_layers_on_32_stages_without_its_mtp_layer():
    """Virtual stage k on rank k % pp as chunk k // pp (PipelineParallelLayerLayout's
    layout[vpp_rank * pp + pp_rank]): with PP 16, stage 16 is rank 0's second chunk. Its `m`
    needs model.mtp_layers = 1 (tests/traces/test_mtp.py)."""
    m = model(61)
    with pytest.raises(ConfigError, match=r"^parallel\.pipeline_layout: 1 MTP layers \(m\), "
                       r"but model\.mtp_layers = 0"):
        check_layout(m, interleaved(16, 2, pipeline_layout="Et|(tt|)*30mL"))
    layout = interleaved(16, 2, pipeline_layout="Et|(tt|)*30L")
    assert counts(m, layout) == [1] + [2] * 30 + [0]
    assert layout.layers_of_stage(m, 16) == range(31, 33)
    assert layout.layers_of_stage(m, 31) == range(61, 61)  # the loss alone
    assert layout.layers_of_rank(m, 0) == 3 and layout.layers_of_rank(m, 15) == 2


def test_the_docs_layout_with_commas_and_an_empty_stage():
    """Megatron-Core's docs: "Et*3|(tt|)*29,m|L"; without MTP the stage before the loss is
    empty, which Megatron-Core builds as a block of no layers."""
    m = model(61)
    layout = interleaved(8, 4, pipeline_layout="Et*3|(tt|)*29,|L")
    assert counts(m, layout) == [3] + [2] * 29 + [0, 0]
    spaced = interleaved(8, 4, pipeline_layout=" E t*3 | (tt|)*29 , | L ")
    assert spaced.stage_layers(m) == layout.stage_layers(m)


@pytest.mark.parametrize(("text", "message"), [
    ("Et|(tt|*3L", "the '(' at position 3 is never closed"),
    ("Et|tt)L", "the ')' at position 5 closes no '('"),
    ("E|(t)|tL", "a (...) group at position 4 needs *N after it"),
    ("E|((t)*2)*2|L", "nested parentheses at position 3"),
    ("Et|x|L", "'x' at position 3 is not a layer symbol"),
    ("E|t*|L", "'*' at position 3 needs a repetition count after it"),
    ("E|t*0|L", "repetition count 0 at position 4 must be from 1 to 1,048,576"),
    ("E|t*99999999999|L", "repetition count 99999999999 at position 4 must be from 1"),
    ("E|(tttt|)*1000000|L", "unrolls to 5,000,004 symbols, more than 1,048,576"),
    ("tE|tL", "must hold the embedding E exactly once, as the first symbol"),
    ("Et|EtL", "must hold the embedding E exactly once, as the first symbol of the first "
     "virtual stage (found 2)"),
    ("Et|L|", "must hold the loss L exactly once, as the last symbol of the last"),
    ("Et|L" * 3000, "12,000 characters, more than 10,000"),
])
def test_a_bad_layout_string_is_one_line_naming_the_rule(text, message):
    with pytest.raises(ConfigError) as info:
        Layout(pp=2, pipeline_layout=text)
    assert str(info.value).startswith("parallel.pipeline_layout: ")
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("keys", "message"), [
    (dict(pp=2, pp_first_layers=1, account_for_loss=True),
     "parallel.account_for_embedding, parallel.account_for_loss: cannot be set with "
     "pp_first_layers / pp_last_layers"),
    (dict(pp=2, account_for_embedding=True, pipeline_layout="Et|tL"),
     "parallel.pipeline_layout: cannot be set with pp_first_layers, pp_last_layers, "
     "account_for_embedding or account_for_loss"),
    (dict(pp=2, pp_last_layers=1, pipeline_layout="Et|tL"),
     "parallel.pipeline_layout: cannot be set with pp_first_layers"),
    (dict(pp=2, pipeline_layout="Et|t|tL"),
     "parallel.pipeline_layout: 3 virtual stages, but pp x vp = 2 x 1 = 2"),
    (dict(pp=2, account_for_embedding=1), "parallel.account_for_embedding: 1 must be true or "
     "false"),
    (dict(pp=2, pipeline_layout=["Et", "tL"]), "parallel.pipeline_layout: ['Et', 'tL'] must "
     "be a string"),
])
def test_combinations_megatron_core_refuses_are_refused(keys, message):
    with pytest.raises(ConfigError) as info:
        Layout(**keys)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize(("layers", "keys", "message"), [
    (8, dict(pp=4, account_for_embedding=True),
     "model.layers + embedding = 9 is not divisible by pp = 4"),
    (12, interleaved(4, 2, account_for_embedding=True, account_for_loss=True),
     "model.layers + embedding + loss = 14 is not divisible by pp = 4"),
    (10, interleaved(4, 4, account_for_embedding=True, account_for_loss=True),
     "model.layers + embedding + loss = 12 over pp = 4 is 3 a rank, not divisible by vp = 4"),
    (5, dict(pp=2, pipeline_layout="Et|ttL"),
     "parallel.pipeline_layout: 3 transformer layers (t), but model.layers = 5"),
])
def test_splits_that_do_not_fit_the_model_are_refused(layers, keys, message):
    layout = keys if isinstance(keys, Layout) else Layout(**keys)
    with pytest.raises(ConfigError) as info:
        check_layout(model(layers), layout)
    assert str(info.value).split(": ", 1)[-1].startswith(message.split(": ", 1)[-1])
    assert message in str(info.value)


def test_new_keys_are_left_out_of_files_at_their_defaults():
    assert Layout().to_dict() == Layout(account_for_embedding=False, account_for_loss=False,
                                        pipeline_layout="").to_dict()
    assert not {"account_for_embedding", "account_for_loss", "pipeline_layout"} & \
        set(Layout(pp=2).to_dict())
    on = Layout(pp=2, vp=2, schedule="interleaved", global_batch=2,
                pipeline_layout="E|tt|tt|L").to_dict()
    assert on["pipeline_layout"] == "E|tt|tt|L" and Layout(**on).pipeline_layout == on[
        "pipeline_layout"]
    both = Layout(pp=2, account_for_embedding=True, account_for_loss=True).to_dict()
    assert both["account_for_embedding"] and both["account_for_loss"]


def test_a_repeated_symbol_inside_a_group_is_unrolled_as_megatron_core_does():
    """Megatron-Core unrolls `(...)*N` first and `x*N` after, so `(t*4|)*14` is 14 stages of 4
    layers; equal to the same layout written out."""
    m = model(60)
    short = Layout(pp=16, global_batch=16, pipeline_layout="Et*2|(t*4|)*14t*2L")
    long = Layout(pp=16, global_batch=16, pipeline_layout="Ett|" + "tttt|" * 14 + "ttL")
    assert counts(m, short) == [2] + [4] * 14 + [2] == counts(m, long)


@pytest.mark.parametrize(("text", "message"), [
    ("E|(t*|)*2|L", "'*' at position 4 needs a repetition count after it"),
    ("E|(tx|)*2|L", "'x' at position 4 is not a layer symbol"),
    ("E|(t*0|)*2|L", "repetition count 0 at position 5 must be from 1"),
    ("E|(t*1048576t*1048576|)*1|L", "the group at position 2 unrolls to 2,097,153 symbols"),
])
def test_a_broken_repetition_inside_a_group_names_its_position_in_the_whole_string(text,
                                                                                    message):
    with pytest.raises(ConfigError) as info:
        Layout(pp=2, pipeline_layout=text)
    assert message in str(info.value) and "\n" not in str(info.value)
