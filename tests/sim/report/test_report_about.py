"""The step report says what a folded rank stands for, CP and EP counted, and carries what the
config says of itself (a shipped example's caveats) (issue 36)."""

from __future__ import annotations

import re

from sim.cli import main
from sim.config import example_path
from sim.report import render_report
from sim.report.about import opening_comment
from sim.simulate import predict
from tests.sim.test_fold_cp import experiment


def folded_note(page: str) -> str:
    found = re.search(r"<p>Folded: ([^<]*)</p>", page)
    assert found is not None
    return found[1]


def test_a_stage_whose_cp_ranks_sit_apart_counts_all_its_devices():
    """TP 4 x CP 4 over 8-GPU servers folds by a CP shift of 2: each simulated rank stands for
    tp 4 x cp 2 x dp 1 = 8 of its stage's 16 GPUs, and the stage has 2 simulated ranks."""
    exp = experiment(tp=4, cp=4, pp=2, dp=1)
    summary, times = predict(exp)
    note = folded_note(render_report(exp, summary, times))
    assert note.startswith("each simulated rank stands for 8 GPUs (tp 4 × cp 2 × dp 1) of "
                           "its pipeline stage's 16, ")
    assert "the stage's 2 simulated ranks (one per CP coordinate modulo 2)" in note
    assert len(times.plan.ranks) == 2 * exp.layout.pp


def test_a_stage_folded_whole_says_so_with_its_experts():
    exp = experiment(tp=1, cp=4, pp=1, dp=2, experts=8, ep=4)
    summary, times = predict(exp)
    note = folded_note(render_report(exp, summary, times))
    assert note.startswith("each simulated rank stands for the 8 GPUs of its pipeline stage "
                           "(tp 1 × cp 4 × dp 2; EP 4 within them), ")
    assert len(times.plan.ranks) == 1


def test_the_deepseek_example_carries_its_caveat():
    text = opening_comment(example_path("deepseek-v3-1024-h100.toml"))
    assert "DualPipe and the report's FP8 recipe are not modelled" in text
    assert "about 2.5x fewer than this file predicts on H100s." in text
    assert "parasim simulate" not in text  # the example's command line is left out


def test_the_report_shows_the_opening_comment_and_not_later_ones(tmp_path, capsys):
    config = tmp_path / "c.toml"
    example = example_path("gpt-tiny-localhost.toml").read_text()
    body = example[example.index("[model]"):]
    config.write_text("# First paragraph, A < B,\n# on two lines.\n#\n#     parasim simulate c.toml"
                      "\n# Second: a caveat.\n\n" + body.replace("[model]", "[model]  # not me"))
    page = tmp_path / "c.html"
    assert main(["simulate", str(config), "--report", str(page)]) == 0
    text = page.read_text()
    assert ("<h2>About this config (its opening comment)</h2>\n<p class='note'>First "
            "paragraph, A &lt; B, on two lines.</p><p class='note'>Second: a caveat.</p>") in text
    assert "not me" not in text and "parasim simulate c.toml" not in text


def test_a_config_without_an_opening_comment_has_no_section(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[model]\nlayers = 2  # a comment after a key\n")
    assert opening_comment(config) == "" and opening_comment(tmp_path / "none.toml") == ""
