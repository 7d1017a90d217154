"""torch is optional: `sim`, `topology` and `traces` import, and the commands that only
simulate (simulate, collective, replay, search) run, without importing it; the commands that
run a config for real (run, validate, calibrate --run) say how to get it in one line.

Each check runs in a fresh interpreter, since this test process may already hold torch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_every_module_of_sim_topology_and_traces_imports_without_torch(tmp_path):
    # Every module, found by walking the packages: the check follows modules as they move.
    proc = _python("""
        import importlib, pkgutil, sys
        names = []
        for top in ("sim", "topology", "traces"):
            package = importlib.import_module(top)
            names.append(top)
            for info in pkgutil.walk_packages(package.__path__, top + "."):
                if not info.name.endswith(".__main__"):  # that one runs the CLI
                    importlib.import_module(info.name)
                    names.append(info.name)
        torch = sorted(n for n in sys.modules if n == "torch" or n.startswith("torch."))
        assert not torch, f"importing them imported {torch[:3]}"
        print(len(names), " ".join(names))
        """, ROOT)
    assert proc.returncode == 0, proc.stderr
    count, names = proc.stdout.split(" ", 1)
    # The packages and the modules behind each command were really imported.
    assert int(count) >= 50
    for name in ("sim.cli", "sim.simulate", "sim.engine.replay", "sim.search", "sim.collectives",
                 "sim.report", "topology", "traces.plan", "traces.kineto"):
        assert name in names.split()


SEARCH = """
[model]
layers = 4
hidden = 256
heads = 4
seq_len = 256
vocab = 1024

[parallel]
global_batch = 8

[search]
tp = [1, 2]
pp = [1, 2]
vp = [1]
micro_batch = [1]
zero = [0]
sp = [false]
recompute = ["none"]
schedule = ["1f1b"]

[cluster]
preset = "tpu-v4"
dims = [2, 2, 2]
"""


def test_the_simulating_commands_run_without_importing_torch(tmp_path):
    (tmp_path / "search.toml").write_text(SEARCH)
    tiny = ROOT / "sim" / "examples" / "gpt-tiny-localhost.toml"
    proc = _python(f"""
        import sys
        from sim.cli import main
        runs = [
            ["simulate", {str(tiny)!r}, "--json", "--trace", "t.json", "--report", "r.html"],
            ["collective", "--sizes", "1M", "--json"],
            ["replay", "t.json", "--json"],
            ["search", "search.toml", "--workers", "1", "--top", "2", "--json"],
        ]
        for argv in runs:
            assert main(argv) == 0, argv
            assert "torch" not in sys.modules, f"parasim {{argv[0]}} imported torch"
        """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "t.json").stat().st_size > 0 and (tmp_path / "r.html").stat().st_size > 0


@pytest.mark.parametrize(("argv", "message"), [
    (["run"], "parasim run needs PyTorch"),
    (["validate"], "parasim validate runs the config for real and needs PyTorch"),
    (["calibrate", "--run", "localhost"], "calibrate --run needs PyTorch"),
])
def test_without_torch_the_commands_that_run_for_real_say_how_to_get_it(tmp_path, capsys,
                                                                        monkeypatch, argv,
                                                                        message):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    out = {"run": ["--out", tmp_path / "o"], "validate": ["--report", tmp_path / "v.html"],
           "calibrate": ["-o", tmp_path / "p.json"]}[argv[0]]
    assert main([str(a) for a in [*argv, *out]]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert message in captured.err and "pip install torch" in captured.err
    assert not any(tmp_path.iterdir())  # nothing written
