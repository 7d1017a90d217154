"""`schedule = "zb1p"` from the command line: simulated faster than 1F1B by what the split
buys, and its bad combinations refused in one line with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main

BASE = ('[model]\nlayers = 8\nhidden = 512\nheads = 8\nseq_len = 256\nvocab = 1024\n'
        '[cluster]\npreset = "dgx-h100"\nnodes = 1\nfabric = "rail"\n'
        '[parallel]\npp = 4\n')


def config(tmp_path: Path, parallel: str) -> str:
    path = tmp_path / "zb.toml"
    path.write_text(BASE + parallel)
    return str(path)


def test_zb1p_simulates_shorter_than_1f1b_with_the_same_work(tmp_path, capsys):
    out = {}
    for schedule in ("1f1b", "zb1p"):
        assert main(["simulate", config(tmp_path, f'tp = 2\nglobal_batch = 16\nschedule = '
                                                   f'"{schedule}"\n'), "--json"]) == 0
        out[schedule] = json.loads(capsys.readouterr().out)
    assert out["zb1p"]["layout"]["schedule"] == "zb1p"
    assert out["zb1p"]["step_time_s"] < out["1f1b"]["step_time_s"]
    assert out["zb1p"]["bubble_fraction"] < out["1f1b"]["bubble_fraction"]


def test_zbv_runs_to_the_end_with_many_micro_batches(tmp_path, capsys):
    """16 micro-batches over a V of 16 stages on 8 ranks: ranks send to each other both ways,
    which blocking sends, or one queue a direction for both legs, would deadlock."""
    out = {}
    for schedule, vp in (("1f1b", 1), ("zbv", 2)):
        path = tmp_path / f"{schedule}.toml"
        path.write_text(BASE.replace("layers = 8", "layers = 16").replace("nodes = 1", "nodes = 2")
                        .replace("pp = 4", "pp = 8")
                        + f'tp = 2\nglobal_batch = 16\nvp = {vp}\nschedule = "{schedule}"\n')
        assert main(["simulate", str(path), "--json"]) == 0
        out[schedule] = json.loads(capsys.readouterr().out)
    assert out["zbv"]["bubble_fraction"] < out["1f1b"]["bubble_fraction"]
    assert out["zbv"]["step_time_s"] < out["1f1b"]["step_time_s"]


@pytest.mark.parametrize(("parallel", "field"), [
    ('tp = 2\nglobal_batch = 9\nschedule = "zb1p"\n', "parallel: 9 micro-batches"),
    ('dp = 2\nglobal_batch = 8\nzero = 3\nschedule = "zb1p"\n', "parallel.zero: 3"),
    ('tp = 2\nglobal_batch = 8\nvp = 2\nschedule = "1f1b"\n', "parallel.vp: 2"),
    ('tp = 2\nglobal_batch = 8\nschedule = "zbx"\n', "parallel.schedule"),
])
def test_bad_combinations_exit_2_in_one_line(tmp_path, capsys, parallel, field):
    assert main(["simulate", config(tmp_path, parallel)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"parasim: error: {field}"), err
