"""The figures the README quotes are what the commands print: this fails when a change moves
them and the README is not brought along (issue 36: the GPT-3 step and the goodput example's
figures had drifted). Each sentence is rebuilt from the command's output and looked up."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sim.cli import main

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
DAY = 86_400.0


def flat(text: str) -> str:
    """The README's prose with its line breaks as spaces."""
    return re.sub(r"\s+", " ", text)


def output(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_the_gpt3_step(capsys):
    step = json.loads(output(capsys, "simulate", "--json"))["step_time_s"]
    assert f"the shipped GPT-3 step's {step:.1f} s" in flat(README)


def test_the_goodput_example(capsys):
    g = json.loads(output(capsys, "goodput", "--days", "54", "--json"))
    text = output(capsys, "goodput", "--days", "54")
    found = re.search(r"checkpoint\s+([\d.]+) TB, write", text)
    assert found is not None, text
    wall_d = g["wall_time_s"]["p50"] / DAY
    per_54 = 54 / wall_d  # the Llama 3 report counts its interruptions over 54 days
    sentence = (
        f"Over 54 days of compute it predicts an MTTI of {g['mtti_s'] / 3600:.2f} h, a "
        f"{found[1]} TB checkpoint written in {g['checkpoint_write_s']:.2f} s every "
        f"{g['checkpoint_interval_s'] / 60:.1f} minutes, a {g['restart_s'] / 60:.1f}-minute "
        f"mean restart, a {g['effective_training_fraction']:.2%} effective fraction and about "
        f"{g['interruptions'] * per_54:,.0f} interruptions per 54 days of wall time "
        f"({g['interruptions']:,.0f} in its {wall_d:.1f} days)")
    assert sentence in flat(README)
