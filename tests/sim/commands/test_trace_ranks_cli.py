"""`simulate --trace-ranks`: the kept ranks' ops are exactly the full trace's, the others gone
(from --trace and --chrome alike); a folded step names the ranks it did not simulate; every bad
selection is one line, exit 2."""

import gzip
import json

import pytest

from sim.cli import main
from sim.commands.trace_ranks import parse_ranks, spans
from sim.config import example_path

TINY = str(example_path("gpt-tiny-localhost.toml"))  # TP 2 x PP 2: 4 ranks


def simulate(capsys, *argv):
    code = main(["simulate", TINY, *map(str, argv)])
    out, err = capsys.readouterr()
    return code, err


def test_kept_ranks_are_the_full_traces_own(tmp_path, capsys):
    full, some = tmp_path / "full.json", tmp_path / "some.json"
    assert simulate(capsys, "--no-fold", "--trace", full)[0] == 0
    assert simulate(capsys, "--no-fold", "--trace", some, "--trace-ranks", "0,2-3") == (0, "")
    whole, kept = json.loads(full.read_text()), json.loads(some.read_text())
    assert sorted(kept["ranks"]) == ["0", "2", "3"]
    assert {r: kept["ranks"][r] for r in kept["ranks"]} == \
        {r: whole["ranks"][r] for r in ("0", "2", "3")}
    assert sorted(kept["meta"]["memory"]) == ["0", "2", "3"]


def test_chrome_keeps_the_same_ranks(tmp_path, capsys):
    path = tmp_path / "step.json.gz"
    assert simulate(capsys, "--no-fold", "--chrome", path, "--trace-ranks", "1")[0] == 0
    events = json.loads(gzip.decompress(path.read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert {e["pid"] for e in events if "pid" in e} == {1}


def test_a_folded_step_names_the_ranks_it_did_not_simulate(tmp_path, capsys):
    path = tmp_path / "t.json"
    code, err = simulate(capsys, "--trace", path, "--trace-ranks", "0-3")
    assert code == 0
    assert err == ("parasim: warning: --trace-ranks: 1,3 not simulated on their own in this "
                   "folded step, left out (--no-fold simulates every rank)\n")
    assert sorted(json.loads(path.read_text())["ranks"]) == ["0", "2"]
    code, err = simulate(capsys, "--trace", path, "--trace-ranks", "1,3")
    assert code == 2 and "none of 1,3 is simulated on its own" in err and not path.exists()


@pytest.mark.parametrize("text", ["4", "3-1", "x", "1-", "-1", "0,,1", "0-99999999999"])
def test_a_bad_selection_is_one_line(tmp_path, capsys, text):
    code, err = simulate(capsys, "--trace", tmp_path / "t.json", "--trace-ranks", text)
    assert code == 2 and err.count("\n") == 1 and err.startswith("parasim: error: --trace-ranks")


def test_trace_ranks_needs_an_output(capsys):
    code, err = simulate(capsys, "--trace-ranks", "0")
    assert code == 2 and "give one of them too" in err


def test_ranges_parse_and_print_back():
    assert parse_ranks("0,8-11, 3", 16) == (0, 3, 8, 9, 10, 11)
    assert spans([0, 3, 8, 9, 10, 11]) == "0,3,8-11"
