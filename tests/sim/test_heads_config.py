"""Issue 32's [model] keys at the command line: `head_dim` and `qk_norm` read from TOML, a
Qwen3-shaped config simulates with their parameters and states them, and a bad value is one
line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main

MODEL = ('layers = 4\nhidden = 256\nheads = 4\nkv_heads = 2\nseq_len = 128\nvocab = 1024\n'
         'ffn = "swiglu"\nffn_hidden = 512\nnorm = "rmsnorm"\nposition = "rope"\nbias = false\n')
REST = ('[parallel]\ntp = 2\npp = 2\ndp = 2\nglobal_batch = 8\n'
        '[cluster]\npreset = "dgx-h100"\nnodes = 1\nfabric = "rail"\n')


def config(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "qwen.toml"
    path.write_text(f"[model]\n{MODEL}{extra}\n{REST}")
    return path


def test_a_head_width_of_its_own_and_qk_norm_simulate(tmp_path, capsys):
    """Heads of 128 on hidden 256 / 4 heads (a query 512 wide, not 256) with qk_norm: the
    summary says so, and each pipeline rank's 2 layers hold, per TP rank of 2, the wider
    q, k, v and o, (256·(512 + 2·256) + 512·256 - 256·(256 + 2·128) - 256·256)/2 = 98,304
    parameters more, and q_norm, k_norm 2·128 = 256: 2 x 98,560 in 2 bytes each."""
    params = []
    for extra in ("", "head_dim = 128\nqk_norm = true"):
        path = str(config(tmp_path, extra))
        assert main(["simulate", path]) == 0
        summary = capsys.readouterr().out
        assert ("heads of 128, qk_norm" in summary) == bool(extra)
        assert main(["simulate", path, "--json"]) == 0
        ranks = json.loads(capsys.readouterr().out)["memory_by_pp_rank"]
        params.append(ranks[0]["params_bytes"])
    assert params[1] - params[0] == 2 * 98_560 * 2


@pytest.mark.parametrize(("extra", "needle"), [
    ("head_dim = -3", "model.head_dim: -3 must be an integer from 1 to 65,536"),
    ("head_dim = 1e3", "model.head_dim: 1000.0 must be an integer"),
    ("head_dim = 2097152", "model.head_dim: 2097152 must be an integer from 1 to 65,536"),
    ('qk_norm = "yes"', "model.qk_norm: 'yes' must be true or false"),
])
def test_bad_values_are_one_line_and_exit_2(tmp_path, capsys, extra, needle):
    code = main(["simulate", str(config(tmp_path, extra))])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "") and err.count("\n") == 1 and needle in err, err
