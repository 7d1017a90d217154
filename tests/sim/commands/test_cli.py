"""The `parasim` command line: tables, --json, and one-line errors with exit status 2."""

import json
import subprocess
import sys

import pytest

from sim.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_collective_json_is_one_object_with_nccl_tests_columns(capsys):
    code, out, err = run_cli(capsys, "collective", "--cluster", "dgx-h100", "--nodes", "2",
                             "--op", "all_reduce", "--sizes", "1M,16M", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["cluster"] == "dgx-h100 x2 fat-tree" and data["op"] == "all_reduce"
    assert [r["size_bytes"] for r in data["rows"]] == [2**20, 16 * 2**20]
    for row in data["rows"]:
        assert row["algbw_GBps"] == pytest.approx(row["size_bytes"] / row["time_s"] / 1e9)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * 15 / 16)


def test_size_range_doubles_like_nccl_tests(capsys):
    code, out, _ = run_cli(capsys, "collective", "--sizes", "1K:8G", "--model", "analytic",
                           "--json")
    sizes = [r["size_bytes"] for r in json.loads(out)["rows"]]
    assert code == 0 and sizes[0] == 1024 and sizes[-1] == 8 * 2**30 and len(sizes) == 24


def test_human_table_and_explicit_algorithm(capsys):
    code, out, _ = run_cli(capsys, "collective", "--op", "all_gather", "--algo", "ring_flows",
                           "--sizes", "1G")  # parasim's own ring at NVLink's rate
    assert code == 0
    assert out.splitlines()[3].split()[1:] == ["size", "count", "type", "redop", "root",
                                               "time", "algbw", "busbw", "#wrong", "time",
                                               "algbw", "busbw", "#wrong", "algo"]
    row = next(line for line in out.splitlines() if not line.startswith("#")).split()
    assert row[-1] == "ring_flows"
    busbw = float(row[7])  # out-of-place busbw, nccl-tests' column
    seconds = 7 / 8 * 2**30 / 370e9 + 7 * 0.47e-6  # one DGX H100: NVLink, 7 steps of latency
    assert busbw == pytest.approx(7 / 8 * 2**30 / seconds / 1e9, abs=0.006)


def test_torus_preset_and_sendrecv(capsys):
    code, out, _ = run_cli(capsys, "collective", "--cluster", "tpu-v4", "--op", "sendrecv",
                           "--sizes", "64M", "--json")
    row = json.loads(out)["rows"][0]
    assert code == 0 and row["algo"] == "direct"
    assert row["busbw_GBps"] < 50  # a neighbour link at most, minus latency


@pytest.mark.parametrize(("argv", "needle"), [
    (["collective", "--sizes", "12Q"], "--sizes: '12Q' is not a size"),
    (["collective", "--sizes", "8G:1K"], "starts above its end"),
    (["collective", "--op", "gather"], "invalid choice: 'gather'"),
    (["collective", "--cluster", "dgx-z1"], "neither a preset"),
    (["collective", "--nodes", "0"], "cluster.nodes: 0 must be an integer from 1 to 131,072"),
    (["collective", "--algo", "tree", "--op", "all_gather"], "tree cannot run all_gather"),
    (["collective", "--algo", "magic"], "'magic' is not an algorithm"),
    (["collective", "--ranks", "1"], "--ranks: 1 must be between 2"),
    (["collective", "--channels", "0"], "--channels: 0 must be from 1 to 64"),
    (["collective", "--nodes", "two"], "invalid int value: 'two'"),
    (["simulate", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_bad_input_gives_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_python_dash_m_sim_exits_2_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "sim", "collective", "--nodes", "-3"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("parasim: error: ") and "Traceback" not in proc.stderr


def test_simulator_imports_no_torch():
    code = ("import sys, sim.cli, sim.collectives, sim.engine.network, topology, traces.ops; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize(("body", "needle"), [
    ('[cluster]\npreset = "dgx-h100"\nnodes = 2\nnic_bandwidth = "-1Gb/s"\n',
     "cluster.nic_bandwidth"),
    ('[cluster]\npreset = "dgx-h100"\nnodes = 2\nnics_per_node = 0\n', "is not connected"),
    ('[cluster]\npreset = "tpu-v4"\ndims = [4, 1]\n', "cluster.dims: [4, 1] must hold integers"),
    ('[cluster]\npreset = "dgx-h100"\nspeed = 3\n', "cluster.speed: unknown key"),
    ('[network]\npreset = "dgx-h100"\n', "has no [cluster] table"),
])
def test_bad_cluster_file_gives_one_line_and_exit_2(capsys, tmp_path, body, needle):
    path = tmp_path / "cluster.toml"
    path.write_text(body)
    code, out, err = run_cli(capsys, "collective", "--cluster", str(path), "--sizes", "1M")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_version_prints_the_installed_version(capsys):
    from sim.provenance import parasim_version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"parasim {parasim_version()}\n"
