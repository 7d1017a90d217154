"""`import parasim` (issue 37): the public calls give what the commands print, and the package
imports and simulates with torch absent (blocked by an import hook, in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import parasim
from sim.cli import main
from sim.config import example_path

ROOT = Path(__file__).resolve().parents[1]
TINY = "gpt-tiny-localhost"


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    capsys.readouterr()
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    del out["parasim"]  # provenance: the command's, not the call's
    return out


def test_simulate_by_name_by_path_and_from_a_loaded_config_equals_the_command(capsys):
    path = example_path(f"{TINY}.toml")
    expected = _cli_json(capsys, "simulate", str(path), "--set", "parallel.micro_batch=2")
    settings = ["parallel.micro_batch=2"]
    assert parasim.simulate(TINY, settings=settings).json() == expected
    assert parasim.simulate(path, settings=settings).json() == expected
    exp = parasim.load_config(f"{TINY}.toml", settings=settings)
    step = parasim.simulate(exp)
    assert step.json() == expected
    assert step.summary.step_time_s == expected["step_time_s"]


def test_goodput_and_search_equal_their_commands(capsys):
    path = str(example_path(f"{TINY}.toml"))
    assert parasim.goodput(TINY, runs=20, seed=3).json() == \
        _cli_json(capsys, "goodput", path, "--runs", "20", "--seed", "3")
    found = parasim.search(TINY, top=2)
    assert found.json() == _cli_json(capsys, "search", path, "--top", "2", "--workers", "1")
    assert found.result.best is found.result.simulated[0]


def test_replay_of_a_predicted_trace_equals_the_command(tmp_path, capsys):
    trace = tmp_path / "step.json"
    assert main(["simulate", str(example_path(f"{TINY}.toml")), "--trace", str(trace)]) == 0
    expected = _cli_json(capsys, "replay", str(trace))
    assert parasim.replay(trace).json() == expected


def test_bad_input_raises_the_command_lines_error():
    with pytest.raises(parasim.ConfigError, match="--runs: 0 must be an integer from 1"):
        parasim.goodput(TINY, runs=0)
    with pytest.raises(parasim.ConfigError, match="goodput: give days or tokens, not both"):
        parasim.goodput(TINY, days=1, tokens=1e9)


def test_import_parasim_and_simulate_with_torch_blocked():
    code = textwrap.dedent("""
        import sys

        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError(f"blocked: {name}")
                return None

        sys.meta_path.insert(0, NoTorch())
        import parasim
        step = parasim.simulate("gpt-tiny-localhost")
        assert not [n for n in sys.modules if n == "torch" or n.startswith("torch.")]
        print(step.summary.step_time_s)
        """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) == parasim.simulate(TINY).summary.step_time_s


def test_the_blocker_really_blocks_torch():
    # the check above could pass by a hook that blocks nothing: the same hook refuses torch
    code = ("import sys\nclass B:\n def find_spec(self, n, p=None, t=None):\n"
            "  if n.split('.')[0] == 'torch': raise ImportError('blocked')\n"
            "sys.meta_path.insert(0, B())\nimport torch\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and "ImportError: blocked" in proc.stderr
