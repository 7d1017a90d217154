"""The README's tour, walked top to bottom as a new user would on a fresh clone: every line of
its command block run in order in a temporary folder holding the clone's shipped examples and
sample traces, each one exiting 0, and the files the tour names written (issue 36)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("sim/examples", "tests/data")
"""What the tour reads from the clone (linked into the temporary folder)."""
WRITTEN = ("my.toml", "step.html", "step.json", "step.json.gz", "sweep.html", "here.json",
           "run.html", "runs/tiny", "v.html")
"""What the tour's lines write, each named by one of them."""


def tour_commands(readme: str) -> list[str]:
    """The command lines of the README's tour block, in order (comment-only lines left out)."""
    section = readme[readme.index("## A short tour"):]
    block = section[section.index("```bash\n") + len("```bash\n"):]
    block = block[:block.index("```")]
    return [line.strip() for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def argv_of(line: str) -> list[str]:
    """The process a tour line starts: parasim (and `python -m sim`) as this checkout's
    `python -m sim`; cp as itself; anything else is a line this test does not know."""
    words = shlex.split(line, comments=True)
    if words[0] == "parasim":
        return [sys.executable, "-m", "sim", *words[1:]]
    if words[:3] == ["python", "-m", "sim"]:
        return [sys.executable, "-m", "sim", *words[3:]]
    assert words[0] == "cp", f"the tour runs {words[0]!r}, which this test does not know"
    return words


def test_the_tour_block_is_what_the_test_runs():
    lines = tour_commands((ROOT / "README.md").read_text())
    assert lines[0] == "parasim simulate                                   # the shipped GPT-3 " \
        "example"
    argvs = [argv_of(line) for line in lines]
    commands = [a[3] if a[0] == sys.executable and len(a) > 3 else a[0] for a in argvs]
    # the profile is made before a line uses it; the replay names a trace that ships
    first_use = min(i for i, a in enumerate(argvs) if "--profile" in a)
    assert commands.index("calibrate") < first_use
    replay = argvs[commands.index("replay")]
    assert (ROOT / replay[4]).is_file()


@pytest.mark.slow
def test_the_tour_runs_top_to_bottom(tmp_path):
    pytest.importorskip("torch")  # run, calibrate and validate run for real
    for shipped in SHIPPED:
        (tmp_path / shipped).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / shipped).symlink_to(ROOT / shipped)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    took = []
    for line in tour_commands((ROOT / "README.md").read_text()):
        start = time.monotonic()
        done = subprocess.run(argv_of(line), cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=900, check=False)
        took.append(f"{time.monotonic() - start:6.1f} s  {line[:70]}")
        assert done.returncode == 0, f"{line}\n{done.stderr[-2000:]}"
    print("\n".join(took))
    missing = [name for name in WRITTEN if not (tmp_path / name).exists()]
    assert missing == []
