"""`--set` on `collective` (the [cluster] of a preset or file) and on `calibrate` (its --run or
--cluster config): the same result as the edited file, a refused value named as the flag, and
the JSON of a command without --set as it was."""

import json

from sim.calibrate.microbench import fit_target, resolve_target
from sim.cli import main
from sim.config import example_path
from sim.settings import parse_setting, parse_settings


def collective_json(capsys, *argv):
    code = main(["collective", "--sizes", "1M,1G", "--json", *map(str, argv)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_collective_set_equals_the_edited_cluster_file(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text('[cluster]\npreset = "dgx-h100"\nnodes = 2\nnic_bandwidth = "100Gb/s"\n')
    edited = collective_json(capsys, "--cluster", path)
    setting = collective_json(capsys, "--cluster", "dgx-h100", "--nodes", "2", "--set",
                              "cluster.nic_bandwidth=100Gb/s")
    plain = collective_json(capsys, "--cluster", "dgx-h100", "--nodes", "2")
    assert setting["rows"] == edited["rows"] != plain["rows"]
    assert setting["parasim"]["config_sha256"] != plain["parasim"]["config_sha256"]


def test_collective_set_on_a_file_and_its_refusals(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text('[cluster]\npreset = "dgx-h100"\nnodes = 2\n')
    wide = collective_json(capsys, "--cluster", path, "--set", "cluster.nodes=4")
    assert wide["ranks"] == 32
    assert main(["collective", "--set", "cluster.nic_bandwidth=0"]) == 2
    assert capsys.readouterr().err == ("parasim: error: --set 'cluster.nic_bandwidth=0': 0 must "
                                       "be a positive bandwidth\n")
    assert main(["collective", "--set", "model.layers=2"]) == 2
    assert "[model] is not a table of the config (known: cluster)" in capsys.readouterr().err


def test_calibrate_targets_take_the_settings():
    tiny = str(example_path("gpt-tiny-localhost.toml"))
    plain = resolve_target(tiny)
    unfused = resolve_target(tiny, None, parse_settings(["model.attention=unfused"]))
    assert (plain.attention, unfused.attention) == ("flash", "unfused")
    assert fit_target("dgx-h100", [], [parse_setting("cluster.nodes=3")]).cluster.num_devices \
        == 24


def test_calibrate_refuses_a_bad_setting_before_measuring(tmp_path, capsys):
    code = main(["calibrate", "--run", str(example_path("gpt-tiny-localhost.toml")), "-o",
                 str(tmp_path / "p.json"), "--set", "parallel.tp=0"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("parasim: error: --set 'parallel.tp=0': ")
    assert err.count("\n") == 1 and not (tmp_path / "p.json").exists()
