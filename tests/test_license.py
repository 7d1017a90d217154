"""The package's license is stated once and shipped: pyproject names Apache-2.0 and LICENSE is
its text; what the README's tour writes into the working tree is ignored by git."""

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_license_file_is_the_apache_2_text_pyproject_names():
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="not a git checkout")
def test_what_the_tour_writes_is_ignored():
    written = ["step.html", "step.json", "step.json.gz", "here.json", "sweep.html", "run.html",
               "v.html", "runs/tiny/rank0.json"]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.stdout.split() == written
    kept = ["tests/data/kineto/a100-2rank-nccl-rank0.json.gz",
            "sim/examples/gpt-tiny-localhost.toml"]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *kept], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.stdout == ""
