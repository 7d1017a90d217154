"""`--set section.key=value`: the same prediction as the edited TOML, provenance that covers the
settings, and every bad setting one line naming the flag (exit 2)."""

import json
import tomllib

import pytest

from sim.cli import main
from sim.config import example_path
from sim.provenance import file_sha256
from sim.settings import (
    apply_settings,
    config_sha256,
    load_search_config,
    parse_setting,
    parse_settings,
    search_tables,
)

TINY = example_path("gpt-tiny-localhost.toml")


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def simulate_json(capsys, *argv):
    code, out, err = run_cli(capsys, "simulate", *argv, "--json")
    assert code == 0, err
    data = json.loads(out)
    digest = data.pop("parasim")["config_sha256"]
    return data, digest


def edited(tmp_path, table, key, value):
    """The tiny example with one key replaced, written as a TOML of its own (the other path)."""
    text = TINY.read_text()
    lines = text.splitlines()
    start = lines.index(f"[{table}]")
    i = next(j for j in range(start, len(lines)) if lines[j].split("=")[0].strip() == key)
    lines[i] = f"{key} = {value}"
    path = tmp_path / TINY.name  # the experiment is named for the file
    path.write_text("\n".join(lines) + "\n")
    assert tomllib.loads(path.read_text())[table][key] == tomllib.loads(f"v = {value}")["v"]
    return path


@pytest.mark.parametrize(("table", "key", "value", "flag"), [
    ("parallel", "micro_batch", "4", "parallel.micro_batch=4"),
    ("parallel", "schedule", '"gpipe"', "parallel.schedule=gpipe"),
    ("model", "dtype", '"bf16"', 'model.dtype="bf16"'),
])
def test_set_predicts_what_the_edited_toml_predicts(capsys, tmp_path, table, key, value, flag):
    by_flag, flag_digest = simulate_json(capsys, TINY, "--set", flag)
    by_file, file_digest = simulate_json(capsys, edited(tmp_path, table, key, value))
    plain, _ = simulate_json(capsys, TINY)
    assert by_flag == by_file
    assert by_flag != plain  # the setting changed the prediction
    assert flag_digest != file_digest  # the provenance says which file and which settings


def test_a_bare_word_is_the_string_it_spells():
    assert parse_setting("model.dtype=fp8").value == "fp8"
    assert parse_setting('model.dtype="fp8"').value == "fp8"
    assert parse_setting("cluster.nic_bandwidth=400Gb/s").value == "400Gb/s"
    assert parse_setting("parallel.tp=4").value == 4
    assert parse_setting("parallel.sp=true").value is True
    assert parse_setting("reliability.rates.gpu=2e-6").path == ("reliability", "rates", "gpu")


def test_provenance_covers_the_settings():
    assert config_sha256(TINY, ()) == file_sha256(TINY)  # outputs without --set as they were
    four = parse_settings(["parallel.micro_batch=4"])
    two = parse_settings(["parallel.micro_batch=2"])
    assert config_sha256(TINY, four) == config_sha256(TINY, parse_settings(
        ["parallel.micro_batch=4"]))
    assert len({file_sha256(TINY), config_sha256(TINY, four), config_sha256(TINY, two)}) == 3


def test_the_provenance_printed_is_the_settings_digest(capsys):
    _, digest = simulate_json(capsys, TINY, "--set", "parallel.micro_batch=4")
    assert digest == config_sha256(TINY, parse_settings(["parallel.micro_batch=4"]))
    _, plain = simulate_json(capsys, TINY)
    assert plain == file_sha256(TINY)


def test_settings_are_applied_to_a_copy_and_the_last_one_wins():
    data = {"parallel": {"tp": 2}, "model": {"layers": 4}}
    out = apply_settings(data, parse_settings(["parallel.tp=4", "parallel.tp=8",
                                               "reliability.rates.gpu=1e-6"]))
    assert out == {"parallel": {"tp": 8}, "model": {"layers": 4},
                   "reliability": {"rates": {"gpu": 1e-6}}}
    assert data == {"parallel": {"tp": 2}, "model": {"layers": 4}}


def test_setting_a_parallel_key_of_a_search_fixes_it(tmp_path):
    path = example_path("gpt3-175b-1024-a100-search.toml")
    data = load_search_config(path, parse_settings(["parallel.tp=8"], search_tables()))
    assert data["parallel"]["tp"] == 8 and "tp" not in data["search"]
    assert "pp" in data["search"]


@pytest.mark.parametrize(("setting", "needle"), [
    ("parallel.tp=0", "--set 'parallel.tp=0': 0 must be an integer from 1"),
    ("parallel.tpp=2", "--set 'parallel.tpp=2': 'tpp' is not a key of [parallel] (known: tp,"),
    ("model.layers=abc", "--set 'model.layers=abc': 'abc' must be a positive integer"),
    ("foo.x=1", "--set 'foo.x=1': [foo] is not a table of the config (known: model,"),
    ("tp=2", "--set 'tp=2': 'tp' must be SECTION.KEY"),
    ("a.b.c.d.e=1", "up to 4 names"),
    ("parallel.tp", "--set 'parallel.tp': must be SECTION.KEY=VALUE"),
    ("parallel.tp=", "--set 'parallel.tp=': no value after '='"),
    ("parallel.tp=[1", "--set 'parallel.tp=[1': not a TOML value"),
    ('model.dtype="fp8', "not a TOML value"),
    ("model.dtype=fp8", "--set 'model.dtype=fp8': \"fp8\" needs FP8 tensor cores"),
    ("sim.network=warp", "--set 'sim.network=warp': "),
    ("model.layers.x=1", "model.layers is 4 in the config, not a table"),
    # a long key named whole, only the value shortened
    ("parallel.gradient_accumulation_fusion=false",
     "--set 'parallel.gradient_accumulation_fusion=false': false is modelled only under"),
    ("model.dtype=" + "x" * 300, "--set 'model.dtype=xxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxx': "),
])
def test_a_bad_setting_is_one_line_naming_the_flag(capsys, setting, needle):
    code, out, err = run_cli(capsys, "simulate", TINY, "--set", setting)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_too_many_settings_are_refused_before_reading_any(capsys):
    argv = [w for _ in range(65) for w in ("--set", "parallel.tp=1")]
    code, _, err = run_cli(capsys, "simulate", TINY, *argv)
    assert code == 2 and "--set: given 65 times, more than 64" in err


@pytest.mark.parametrize("argv", [
    ["goodput", TINY, "--set", "reliability.mtti_x=1"],
    ["search", "--set", "search.foo=[1]"],
    ["search", "--set", "parallel.tpp=1"],
    ["run", TINY, "--out", "never-made", "--set", "parallel.tpp=1"],
    ["validate", TINY, "--set", "parallel.tpp=1"],
])
def test_every_command_that_reads_a_config_takes_set(capsys, tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("parasim: error: --set '") and "is not a key of" in err
    assert not (tmp_path / "never-made").exists()
