"""`parasim search`'s candidate space: the [search] table, defaults, pruning reasons, and one-line
errors (exit 2) for a bad table."""

import itertools
import random
import re

import pytest

from sim.cli import main
from sim.search.problem import context, problem_from_dict
from sim.search.run import kendall_tau
from sim.search.space import default_values, describe, layout_key, reason_of, validate
from tests.sim.search.search_cases import SMALL_TOML, small
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec


def space_of(data, gpus=None):
    return context(problem_from_dict(data, gpus=gpus)).space


def test_candidates_follow_the_table_in_order_and_dp_is_what_is_left():
    space = space_of(small(tp=[2, 8], pp=[1, 2], zero=[0], recompute=["full"],
                           micro_batch=[1]))
    tables = list(space.candidates())
    assert space.size == len(tables) == 4
    assert [(t["tp"], t["pp"], t["dp"]) for t in tables] == [(2, 1, 8), (2, 2, 4), (8, 1, 2),
                                                             (8, 2, 1)]
    assert all(t["global_batch"] == 16 for t in tables)


def test_keys_left_out_take_the_defaults_and_fixed_keys_stay_fixed():
    data = small()
    del data["search"]["pp"], data["search"]["schedule"]
    data["parallel"]["zero"] = 1
    del data["search"]["zero"]
    space = space_of(data)
    assert space.values["pp"] == (1, 2, 3, 4, 6, 8, 12, 24)  # divisors of 24 layers
    assert space.values["schedule"] == ("1f1b", "interleaved")
    assert "zero" not in space.values
    assert all(t["zero"] == 1 for t in space.candidates())


def test_defaults_powers_of_two_within_a_node():
    model = ModelSpec(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200)
    values = default_values(model, devices_per_server=8)
    assert values["tp"] == (1, 2, 4, 8)
    assert values["pp"] == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96)
    assert values["zero"] == (0, 1, 2, 3) and values["sp"] == (False, True)
    assert values["recompute"] == ("none", "selective", "full")
    assert default_values(model, devices_per_server=6)["tp"] == (1, 2, 4)


def test_gpus_flag_sets_the_node_count():
    space = space_of(small(), gpus=32)
    assert space.world == 32
    with pytest.raises(ConfigError, match=r"^--gpus: 12 must be a positive multiple of the 8 "
                                          r"GPUs of a node$"):
        problem_from_dict(small(), gpus=12)


def test_pruning_reasons_blank_the_numbers_and_keep_the_rule():
    model = ModelSpec(layers=24, hidden=2048, heads=16, seq_len=2048, vocab=51200)
    with pytest.raises(ConfigError) as err:
        validate({"tp": 1, "pp": 16, "vp": 2, "dp": 1, "global_batch": 64,
                  "schedule": "interleaved"}, model, world=16, devices_per_server=8)
    assert str(err.value) == "model.layers: 24 is not divisible by pp x vp = 16 x 2 = 32 stages"
    assert reason_of(err.value) == "model.layers: N is not divisible by pp x vp = N x N = N stages"
    with pytest.raises(ConfigError) as err:
        validate({"tp": 16, "dp": 1, "global_batch": 4}, model, world=16, devices_per_server=8)
    assert reason_of(err.value).startswith("parallel.tp: N is larger than a node")


def test_layout_key_orders_every_layout_and_describe_is_short():
    a = Layout(tp=8, pp=16, dp=8, global_batch=1536, recompute="full")
    b = Layout(tp=8, pp=16, dp=8, global_batch=1536, recompute="full", zero=1)
    assert layout_key(a) < layout_key(b) and layout_key(a) == layout_key(Layout(**a.to_dict()))
    assert describe(a) == "tp8 pp16 dp8 mb1 z0 full 1f1b"
    c = Layout(tp=4, pp=4, dp=2, vp=2, sp=True, global_batch=32, schedule="interleaved")
    assert describe(c) == "tp4 pp4 dp2 vp2 mb1 z0 sp none interleaved"


def test_kendall_tau_closed_forms_and_scipy():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == (1.0, 0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == (-1.0, 6)
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == (pytest.approx(1 / 3), 1)  # (2 - 1) / 3
    assert kendall_tau([1.0], [2.0]) == (None, 0)
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(7)
    for _ in range(20):
        xs = [rng.choice([1.0, 2.0, 3.0, 4.0, 5.0]) for _ in range(12)]  # with ties
        ys = [rng.choice([1.0, 2.0, 3.0]) for _ in range(12)]
        assert kendall_tau(xs, ys)[0] == pytest.approx(stats.kendalltau(xs, ys).statistic)


# --- a bad [search] table: one line naming the field and the rule, exit 2 ------------------------

BAD_SEARCH = [
    ("foo = [1]", r"search\.foo: unknown key \(known: tp, cp, pp, vp, micro_batch, zero, sp, "
                  r"recompute, schedule, ep, etp\)"),
    ("tp = []", r"search\.tp: \[\] must be a non-empty list of candidate values"),
    ("tp = 8", r"search\.tp: 8 must be a non-empty list of candidate values"),
    ('tp = ["8"]', r"search\.tp\[0\]: '8' must be an integer"),
    ("tp = [2, 2.0]", r"search\.tp\[1\]: 2\.0 must be an integer"),
    ("sp = [1]", r"search\.sp\[0\]: 1 must be true or false"),
    ('recompute = ["some"]', r"search\.recompute\[0\]: 'some' is not one of none, selective, "
                             r"full"),
    ("zero = [4]", r"search\.zero\[0\]: 4 must be an integer from 0 to 3"),
    ("pp = [2, 2]", r"search\.pp: 2 is listed twice"),
    ("dp = [2]", r"search\.dp: dp is not searched; it is what is left of the GPUs"),
    ("tp = [3, 5]", r"search: none of the 72 candidates is a valid layout \(48 break the rule: "
                    r"parallel: tp 3 x cp 1 x pp \d x dp \d = \d+ ranks, but the cluster has "
                    r"16 GPUs\)"),
]


@pytest.mark.parametrize(("line", "message"), BAD_SEARCH)
def test_a_bad_search_table_is_one_line_and_exit_2(tmp_path, capsys, line, message):
    key = line.split(" ")[0]
    text = "\n".join(row for row in SMALL_TOML.splitlines() if not row.startswith(f"{key} ="))
    path = tmp_path / "bad.toml"
    path.write_text(text.replace("[search]\n", f"[search]\n{line}\n"))
    report = tmp_path / "r.html"
    code = main(["search", str(path), "--json", "--workers", "1", "--report", str(report)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and not report.exists()
    assert err.count("\n") == 1
    assert err.startswith("parasim: error: ")
    assert re.search(message, err), err


@pytest.mark.parametrize(("change", "message"), [
    ("[parallel]\nglobal_batch = 16\ntp = 8", r"search\.tp: also fixed in \[parallel\]; a key is "
                                              r"either fixed or searched"),
    ("[parallel]\nglobal_batch = 16\nfoo = 1", r"parallel\.foo: unknown key"),
    ("[parallel]\nmicro_batch = 1", r"parallel\.global_batch: missing; a search fixes the "
                                     r"global batch"),
    ("[cluster]\npreset = \"dgx-a100\"\nnodes = 2\ngpu_memory = \"1GiB\"\n[x]",
     r"\[x\]: unknown table"),
])
def test_bad_fixed_keys_are_one_line_too(tmp_path, capsys, change, message):
    section = change.split("\n")[0]
    text = SMALL_TOML.replace(f"{section}\n", f"{change}\n#", 1)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code = main(["search", str(path), "--workers", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert re.search(message, err), err


def test_a_space_where_nothing_fits_is_one_line(tmp_path, capsys):
    path = tmp_path / "tiny.toml"
    path.write_text(SMALL_TOML.replace('gpu_memory = "16GiB"', 'gpu_memory = "1GiB"'))
    code = main(["search", str(path), "--workers", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("parasim: error: search: none of the ") and err.count("\n") == 1
    assert "valid layouts fits in memory (the smallest peak is" in err


@pytest.mark.parametrize(("flags", "message"), [
    (["--top", "0"], r"--top: 0 must be an integer from 1 to 4,096"),
    (["--workers", "0"], r"--workers: 0 must be an integer from 1 to 1,024"),
    (["--gpus", "20"], r"--gpus: 20 must be a positive multiple of the 8 GPUs of a node"),
    (["--report", ""], r"--report: an empty path names no file"),
])
def test_bad_flags_are_one_line(tmp_path, capsys, flags, message):
    path = tmp_path / "s.toml"
    path.write_text(SMALL_TOML)
    code = main(["search", str(path), *flags])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert re.search(message, err), err


def test_every_raw_candidate_is_enumerated_once():
    space = space_of(small())
    keys = list(space.values)
    combos = {tuple(t[k] for k in keys) for t in space.candidates()}
    assert combos == set(itertools.product(*space.values.values()))


def test_problems_that_differ_only_in_search_have_their_own_context():
    first = context(problem_from_dict(small(tp=[8])))
    second = context(problem_from_dict(small(tp=[4])))
    assert first.space.values["tp"] == (8,) and second.space.values["tp"] == (4,)
