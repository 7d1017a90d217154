"""Issue 22, items 20 and 21: `parasim search` prints its pruning reasons with a candidate's
own numbers, its table aligned whatever the layouts' length, every option that differs between
the candidates shown; its --report page holds every point, the best's label off the star.

    pytest tests/sim/search/test_search_output_friendly.py -q
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from sim.search.engines import open_engine
from sim.search.output import differing_options, layout_text, result_json, result_text
from sim.search.problem import problem_from_dict
from sim.search.report import search_figure
from sim.search.run import search
from sim.search.space import MEMORY_REASON, describe
from tests.sim.search.search_cases import small


@pytest.fixture(scope="module")
def result():
    with open_engine(workers=1) as engine:
        return search(problem_from_dict(small(), name="small"), engine=engine, top_k=3)


def test_pruning_reasons_carry_a_candidates_numbers(result):
    text = result_text(result, timings=False).splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith("  pruned"))
    reasons = text[at + 1:at + 1 + len(result.pruned)]
    for line, (reason, count) in zip(reasons, result.pruned.items()):
        number, said = line.strip().split("  ", 1)
        assert number == f"{count:,}"
        if reason == MEMORY_REASON:
            continue
        assert said.startswith("e.g. ")
        example = said[len("e.g. "):]
        assert example == result.examples[reason]
        assert re.sub(r"\d+(\.\d+)?", "N", example) == reason  # the reason, numbers restored
        assert not re.search(r"\bN\b", example)
    assert result_json(result)["pruned"] == result.pruned  # the JSON keeps its keys


def test_the_table_is_aligned_however_long_the_layouts(result):
    text = result_text(result, timings=False).splitlines()
    head = next(i for i, line in enumerate(text) if line.strip().startswith("#  layout"))
    rows = text[head:head + 1 + len(result.simulated)]
    # every column ends where the header's does
    ends = [m.end() for m in re.finditer(r"\S+(?= |$)", rows[0])]
    for row in rows[1:]:
        assert len(row) == len(rows[0])
        for end in ends[-6:]:
            assert row[end - 1] != " "


def test_options_that_differ_are_shown(result):
    a, b = result.simulated[:2]
    b2 = dataclasses.replace(b, layout=dataclasses.replace(b.layout, overlap_grad_reduce=False,
                                                             bucket_bytes=2**20))
    assert differing_options([a, b2]) == ["bucket_bytes", "overlap_grad_reduce"]
    assert layout_text(b2, differing_options([a, b2])) == (
        f"{describe(b.layout)} bucket_bytes=1048576 overlap_grad_reduce=False")
    assert differing_options(result.simulated) == []  # searched keys: describe shows them
    same = dataclasses.replace(result, simulated=[a, b2])
    assert "overlap_grad_reduce=False" in result_text(same, timings=False)


def test_the_report_holds_every_point_and_labels_the_best_below_it(result):
    fig = search_figure(result).to_dict()
    lo, hi = fig["layout"]["xaxis"]["range"]
    assert fig["layout"]["xaxis"]["type"] == "log"
    xs = [x for t in fig["data"] for x in (t.get("x") or []) if x is not None]
    assert xs and 10**lo <= min(xs) and max(xs) <= 10**hi
    y_lo, y_hi = fig["layout"]["yaxis"]["range"]
    ys = [y for t in fig["data"] for y in (t.get("y") or []) if y is not None]
    assert 10**y_lo <= min(ys) and max(ys) <= 10**y_hi
    label = next(a for a in fig["layout"]["annotations"] if a["text"].startswith("best:"))
    assert label["ay"] > 0  # below the point: every other simulated point is slower
    assert label["x"] == pytest.approx(math.log10(result.best.simulated.peak_memory_bytes
                                                  / 2**30))


def test_the_memory_lines_label_sits_on_the_line_inside_the_chart(result):
    """On the log axis the label's x is the exponent of the line's (add_vline's own label took
    the GiB as the exponent: drawn at 10^16 GiB, off the page)."""
    fig = search_figure(result).to_dict()
    line = next(s for s in fig["layout"]["shapes"] if s["type"] == "line")
    label = next(a for a in fig["layout"]["annotations"] if "memory" in a["text"])
    capacity = result.memory_capacity_bytes / 2**30
    assert line["x0"] == line["x1"] == capacity
    assert label["x"] == pytest.approx(math.log10(capacity)) and label["xref"] == "x"
    lo, hi = fig["layout"]["xaxis"]["range"]
    assert lo <= label["x"] <= hi
    assert label["text"] == f"GPU memory {capacity:,.1f} GiB"
