"""Provenance: every --json names the parasim version, the profile and the input's sha256."""

import hashlib
import json
import tomllib
from importlib import metadata

import pytest

from sim.cli import main
from sim.config import experiment_from_dict
from sim.profile import ComputeParams, Profile
from sim.provenance import files_sha256, flags_sha256
from sim.simulate import predict, summary_json
from tests.sim.commands.test_simulate_cli import SMALL
from traces.header import ClusterTable, TraceMeta
from traces.io import save
from traces.ops import Op, OpKind, Trace


def run_json(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    return json.loads(out)


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def test_simulate_json_carries_version_profile_and_the_configs_sha256(capsys, small):
    r = run_json(capsys, "simulate", small, "--json")
    assert r["parasim"] == {"version": metadata.version("parasim"),
                            "profile": {"name": "default-H100-SXM5-80GB", "calibrated": False},
                            "config_sha256": sha256(small)}
    # One key added, the others as before: consumers of the old object are not broken.
    exp = experiment_from_dict(tomllib.loads(SMALL))
    assert list(r) == [*summary_json(exp, predict(exp)[0]), "parasim"]


def test_a_calibrated_profile_is_named_and_any_change_to_the_config_changes_the_hash(
        capsys, small, tmp_path):
    profile = tmp_path / "lab.json"
    Profile(name="lab-h100", calibrated=True, measured_on="H100-SXM5-80GB",
            compute=ComputeParams(gemm_efficiency=0.6)).save(profile)
    r = run_json(capsys, "simulate", small, "--json", "--profile", profile)
    assert r["parasim"]["profile"] == {"name": "lab-h100", "calibrated": True}
    before = r["parasim"]["config_sha256"]
    small.write_text(SMALL + "\n")  # one byte more, the same experiment
    after = run_json(capsys, "simulate", small, "--json", "--profile", profile)
    assert after["parasim"]["config_sha256"] == sha256(small) != before
    assert after["step_time_s"] == r["step_time_s"]


def test_collective_hashes_the_canonical_flags_of_a_preset_or_the_cluster_file(
        capsys, tmp_path):
    argv = ["collective", "--cluster", "dgx-h100", "--nodes", "2", "--sizes", "1M,16M",
            "--model", "analytic", "--json"]
    r = run_json(capsys, *argv)
    assert r["parasim"]["profile"] == {"name": "default-H100-SXM5-80GB", "calibrated": False}
    assert r["parasim"]["config_sha256"] == flags_sha256(
        {"cluster": "dgx-h100", "nodes": 2, "fabric": None, "op": "all_reduce",
         "sizes": [2**20, 16 * 2**20], "algo": "auto", "channels": None, "ranks": 16,
         "model": "analytic"})
    # The same sizes spelled otherwise are the same input; another node count is not.
    same = run_json(capsys, *argv[:5], "--sizes", "1048576,16M", *argv[7:])
    other = run_json(capsys, *argv[:4], "4", *argv[5:])
    assert same["parasim"] == r["parasim"] != other["parasim"]
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[cluster]\npreset = "dgx-a100"\nnodes = 2\n')
    r = run_json(capsys, "collective", "--cluster", cluster, "--sizes", "1M", "--json")
    assert r["parasim"]["config_sha256"] == sha256(cluster)
    assert r["parasim"]["profile"]["name"] == "default-A100-SXM4-80GB"


def test_replay_hashes_the_trace_file_or_the_folders_listing(capsys, tmp_path):
    ar = Op(kind=OpKind.ALL_REDUCE, stream="c", group=(0, 1), size_bytes=2**20,
            start=0.0, end=1e-4)
    meta = TraceMeta(cluster_spec=ClusterTable(preset="dgx-h100", nodes=1, fabric="fat-tree"))
    save(Trace({0: (ar,), 1: (ar,)}, meta), tmp_path / "both.json")
    r = run_json(capsys, "replay", tmp_path / "both.json", "--json")
    assert r["parasim"]["config_sha256"] == sha256(tmp_path / "both.json")
    assert r["parasim"]["profile"] == {"name": "default-H100-SXM5-80GB", "calibrated": False}
    folder = tmp_path / "run"
    folder.mkdir()
    for rank in (0, 1):
        save(Trace({rank: (ar,)}, meta), folder / f"rank{rank}.json")
    r = run_json(capsys, "replay", folder, "--json")
    listing = "".join(f"{sha256(folder / name)}  {name}\n" for name in ("rank0.json",
                                                                         "rank1.json"))
    assert r["parasim"]["config_sha256"] == hashlib.sha256(listing.encode()).hexdigest()
    renamed = [folder / "rank0.json", folder / "rank9.json"]
    (folder / "rank1.json").rename(renamed[1])
    assert files_sha256(renamed) != r["parasim"]["config_sha256"]  # names count too
