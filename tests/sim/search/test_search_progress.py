"""The progress bar of `parasim search` (`sim.commands.search._Progress` over the command
line's tqdm bar): one bar per tier, candidates done / total, the best step time so far; drawn
on a terminal only.

    pytest tests/sim/search/test_search_progress.py -q
"""

import io
import math

import pytest

from sim.cli import main
from sim.commands.common import ProgressBar
from sim.commands.search import _Progress
from sim.search.engines import open_engine
from sim.search.problem import problem_from_dict
from sim.search.run import search
from tests.sim.search.search_cases import SMALL, SMALL_TOML


class FakeBar:
    """Records what the progress does with a bar."""

    def __init__(self, log, tier, unit):
        self.log, self.tier = log, tier
        self.bar = self  # the tqdm bar's place: set_postfix_str lands here
        log.append(("open", tier, unit))

    def set_postfix_str(self, text, refresh=True):
        self.log.append(("best", self.tier, text))

    def update(self, done, total):
        self.log.append(("update", self.tier, done, total))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.log.append(("close", self.tier))


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_one_bar_per_tier_with_counts_and_the_best():
    log = []
    with _Progress(lambda tier, unit: FakeBar(log, tier, unit)) as progress:
        progress.update("screen", 40, 144, None)  # nothing fits yet: no best shown
        progress.update("screen", 144, 144, 2.5)
        progress.update("simulate", 1, 3, 3.25)
        progress.update("simulate", 3, 3, 2.75)
    assert log == [
        ("open", "screen", "layout"), ("update", "screen", 40, 144),
        ("best", "screen", "best 2.5 s"), ("update", "screen", 144, 144),
        ("close", "screen"),
        ("open", "simulate", "layout"),
        ("best", "simulate", "best 3.25 s"), ("update", "simulate", 1, 3),
        ("best", "simulate", "best 2.75 s"), ("update", "simulate", 3, 3),
        ("close", "simulate"),
    ]


def test_a_search_reports_both_tiers_to_the_end():
    calls = []
    with open_engine(workers=1) as engine:
        result = search(problem_from_dict(SMALL, name="small"), engine=engine, top_k=2,
                        progress=lambda *a: calls.append(a))
    screen = [c for c in calls if c[0] == "screen"]
    simulate = [c for c in calls if c[0] == "simulate"]
    assert calls == screen + simulate  # the screen first, then the simulations
    assert [c[2] for c in screen] == [144] * len(screen)
    assert [c[1] for c in screen] == sorted(c[1] for c in screen) and screen[-1][1] == 144
    assert screen[-1][3] == result.feasible[0].estimate.step_time_s  # the analytic best
    # the top 2, and the rule of thumb when it is not among them; each tier's bar starts at 0
    # (issue 36: no silent phase between them)
    total = len(simulate) - 1
    assert screen[0] == ("screen", 0, 144, None) and simulate[0] == ("simulate", 0, total, None)
    assert [c[1:3] for c in simulate] == [(i, total) for i in range(total + 1)]
    bests = [c[3] for c in simulate[1:]]
    assert bests == sorted(bests, reverse=True)
    assert bests[-1] == min(result.best.simulated.step_time_s,
                            result.rule.simulated.step_time_s)


def test_on_a_terminal_the_bar_shows_tier_counts_and_best(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with _Progress(ProgressBar) as progress:
        progress.update("screen", 144, 144, 2.5)
        bar = progress.bar.bar
        assert not bar.disable and (bar.n, bar.total) == (144, 144)
        bar.refresh()  # tqdm waits a second (delay) before its first frame
        progress.update("simulate", 1, 3, math.pi)
        assert progress.bar.bar.postfix == "best 3.142 s"
    drawn = terminal.getvalue()
    assert "screen: 100%" in drawn and "144/144" in drawn and "best 2.5 s" in drawn


def test_off_when_stderr_is_not_a_terminal(monkeypatch):
    pipe = io.StringIO()  # isatty() is False
    monkeypatch.setattr("sys.stderr", pipe)
    with _Progress(ProgressBar) as progress:
        progress.update("screen", 144, 144, 2.5)
        assert progress.bar.bar.disable
        progress.bar.bar.refresh()
    assert pipe.getvalue() == ""


@pytest.mark.parametrize("flag", [[], ["--json"]])
def test_the_command_writes_nothing_on_a_piped_stderr(capsys, tmp_path, flag):
    config = tmp_path / "small.toml"
    config.write_text(SMALL_TOML)
    assert main(["search", str(config), "--top", "2", "--workers", "1", *flag]) == 0
    assert capsys.readouterr().err == ""
