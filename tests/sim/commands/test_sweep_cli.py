"""`parasim sweep KEY VALUE...`: each point equals `parasim simulate --set KEY=VALUE` (two
independent paths), the JSON is deterministic, bad values are named together, and the report
carries the table and both charts."""

import json

import pytest

from sim.cli import main
from sim.config import example_path
from sim.settings import config_sha256, parse_settings
from sim.sweep.points import MAX_VALUES

TINY = str(example_path("gpt-tiny-localhost.toml"))


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def simulate(capsys, *argv):
    code, out, err = run_cli(capsys, "simulate", TINY, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_each_point_is_the_simulation_with_that_setting(capsys):
    code, out, err = run_cli(capsys, "sweep", "parallel.micro_batch", "1", "2", "4", "8",
                             "--config", TINY, "--set", "parallel.schedule=gpipe", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["key"] == "parallel.micro_batch"
    assert [p["value"] for p in data["points"]] == [1, 2, 4, 8]
    for point in data["points"]:
        alone = simulate(capsys, "--set", "parallel.schedule=gpipe",
                         "--set", f"parallel.micro_batch={point['value']}")
        assert alone["layout"]["micro_batch"] == point["value"]
        assert point["step_time_s"] == alone["step_time_s"]
        assert point["tokens_per_s"] == alone["tokens_per_s"]
        assert point["tokens_per_s_per_gpu"] == alone["tokens_per_s"] / alone["world"]
        assert point["mfu"] == alone["mfu"]
        assert point["peak_memory_bytes"] == alone["peak_memory_bytes"]
        assert point["fits"] == alone["fits"]
    assert len({p["step_time_s"] for p in data["points"]}) == 4  # the key mattered
    assert data["parasim"]["config_sha256"] == config_sha256(
        TINY, parse_settings(["parallel.schedule=gpipe"]))


def test_the_json_is_deterministic(capsys):
    argv = ("sweep", "parallel.schedule", "1f1b", "gpipe", "--config", TINY, "--json")
    first = run_cli(capsys, *argv)
    assert first == run_cli(capsys, *argv) and first[0] == 0
    assert [p["value"] for p in json.loads(first[1])["points"]] == ["1f1b", "gpipe"]


def test_the_table_has_a_row_per_value_in_the_order_given(capsys):
    code, out, _ = run_cli(capsys, "sweep", "parallel.micro_batch", "4", "1", "--config", TINY)
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["value"])
    assert lines[header].split() == ["value", "step", "time", "tokens/s/GPU", "MFU", "peak",
                                     "memory", "fits"]
    assert [line.split()[0] for line in lines[header + 1:]] == ["4", "1"]
    assert all(line.split()[-1] == "yes" for line in lines[header + 1:])
    assert code == 0


@pytest.mark.parametrize(("argv", "needle"), [
    (["parallel.micro_batch", "1", "3", "5"],
     "sweep parallel.micro_batch: 2 of 3 values refused: 3 (parallel.global_batch: 8 is not "
     "divisible by micro_batch x dp = 3 x 1); 5 ("),
    (["parallel.tpp", "1"], "sweep 'parallel.tpp=1': 'tpp' is not a key of [parallel]"),
    (["tp", "1"], "sweep 'tp=1': 'tp' must be SECTION.KEY"),
    (["parallel.tp", "1", "1"], "sweep parallel.tp: '1' is the same value as '1'"),
    (["parallel.tp", "[1"], "sweep 'parallel.tp=[1': not a TOML value"),
    (["parallel.micro_batch", *map(str, range(1, MAX_VALUES + 2))],
     f"sweep: {MAX_VALUES + 1} values; give 1 to {MAX_VALUES}"),
])
def test_bad_values_are_one_line_and_nothing_runs(capsys, tmp_path, argv, needle):
    report = tmp_path / "sweep.html"
    code, out, err = run_cli(capsys, "sweep", *argv, "--config", TINY, "--report", report)
    assert code == 2 and out == "" and not report.exists()
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_the_report_carries_the_table_and_both_charts(capsys, tmp_path):
    argv = ["sweep", "parallel.micro_batch", "1", "2", "--config", TINY, "--set",
            "cluster.gpu_memory=5700KiB"]
    code, out, _ = run_cli(capsys, *argv, "--report", tmp_path / "a.html")
    page = (tmp_path / "a.html").read_text()
    assert code == 0
    assert "id=\"parasim-sweep-time\"" in page and "id=\"parasim-sweep-memory\"" in page
    assert out.splitlines()[-1] in page  # the table as printed
    assert "NO" in out.splitlines()[-1] and "yes" in out.splitlines()[-2]  # mb 2 does not fit
    run_cli(capsys, *argv, "--report", tmp_path / "b.html")
    assert (tmp_path / "b.html").read_text() == page
