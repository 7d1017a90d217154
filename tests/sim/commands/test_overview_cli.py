"""Bare `parasim` prints every command with one example (exit 0), each command's --help ends
with the same example, and every example parses as the command line it claims to be."""

import shlex
import subprocess
import sys

import pytest

from sim.cli import COMMANDS, _build_parser, command, main
from sim.commands.overview import EXAMPLES


def test_every_command_has_one_example_of_itself():
    assert list(EXAMPLES) == list(COMMANDS)
    for name, line in EXAMPLES.items():
        assert shlex.split(line)[:2] == ["parasim", name]


@pytest.mark.parametrize("name", COMMANDS)
def test_each_example_parses(name):
    words = shlex.split(EXAMPLES[name])[1:]
    args = _build_parser(words).parse_args(words)  # a dry parse: a bad flag raises ConfigError
    assert args.command == name


def test_bare_parasim_lists_every_command_with_its_help_and_example(capsys):
    assert main([]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    for name in COMMANDS:
        i = next(i for i, line in enumerate(lines) if line.split()[:1] == [name])
        assert lines[i].split(None, 1)[1] == command(name).HELP
        assert lines[i + 1].strip() == EXAMPLES[name]


def test_bare_python_dash_m_sim_exits_0_with_the_overview():
    proc = subprocess.run([sys.executable, "-m", "sim"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == ""
    assert EXAMPLES["simulate"] in proc.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_each_help_ends_with_its_example(capsys, name):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    out, _ = capsys.readouterr()
    assert exit_.value.code == 0
    assert out.rstrip().splitlines()[-1] == f"example: {EXAMPLES[name]}"
