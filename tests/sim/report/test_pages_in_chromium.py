"""Every report type opened in headless Chromium: no console message, its main chart drawn,
under 3 MB (issue 36). Skipped where there is no `chromium` (Debian: apt-get install chromium).

The pages log nothing when they work, so any console line (an error, an uncaught exception, a
rejected promise) fails the test. A chart is drawn once plotly has marked its div
`js-plotly-plot` and put its SVG inside."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sim.cli import main
from sim.config import example_path
from tests.sim.search.search_cases import SMALL_TOML

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MAX_BYTES = 3_000_000
BROWSER_NOTE = re.compile(r'"\[\.WebGL-\w+\]GL Driver Message \(OpenGL, Performance')
"""The browser's own note on software WebGL (the search's point cloud), not the page's."""
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine"),
              pytest.mark.slow]


def open_in_chromium(page: Path) -> tuple[str, list[str]]:
    """The page's DOM once its scripts have run, and every console line it printed."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader",
         "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=30000", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180, check=False)
    console = [line for line in done.stderr.splitlines()
               if ":CONSOLE" in line and not BROWSER_NOTE.search(line)]
    return done.stdout, console


def drawn(dom: str, div: str) -> bool:
    """Whether plotly drew into the div `div` (its tag marked, an SVG inside)."""
    tag = re.search(rf"<div[^>]*\bid=\"{re.escape(div)}\"[^>]*>", dom)
    if tag is None or "js-plotly-plot" not in tag[0]:
        return False
    return "main-svg" in dom[tag.end():tag.end() + 20_000]


def check_page(page: Path, divs: tuple[str, ...]) -> None:
    size = page.stat().st_size
    assert size < MAX_BYTES, f"{page.name}: {size:,} bytes"
    dom, console = open_in_chromium(page)
    assert console == []
    assert all(drawn(dom, div) for div in divs), [d for d in divs if not drawn(dom, d)]


def run(*argv: object) -> None:
    assert main([str(a) for a in argv]) == 0


def test_the_step_report(tmp_path, capsys):
    page = tmp_path / "step.html"
    run("simulate", example_path("llama3-70b-h100.toml"), "--report", page)
    check_page(page, ("parasim-pipeline", "parasim-waterfall", "parasim-breakdown",
                      "parasim-lanes", "parasim-memory-time", "parasim-memory"))


def test_the_search_report(tmp_path, capsys):
    config = tmp_path / "small.toml"
    config.write_text(SMALL_TOML)
    page = tmp_path / "search.html"
    run("search", config, "--workers", "1", "--top", "2", "--report", page)
    check_page(page, ("parasim-search",))


def test_the_goodput_report(tmp_path, capsys):
    page = tmp_path / "goodput.html"
    run("goodput", "--days", "54", "--report", page)
    check_page(page, ("goodput-progress", "goodput-lost", "goodput-interval"))


def test_the_sweep_report(tmp_path, capsys):
    page = tmp_path / "sweep.html"
    run("sweep", "parallel.micro_batch", "1", "2", "--config",
        example_path("gpt-tiny-localhost.toml"), "--report", page)
    check_page(page, ("parasim-sweep-time", "parasim-sweep-memory"))


def test_the_validate_report(tmp_path):
    from tests.sim.report.validation_page import simulated_validation_page

    page = tmp_path / "validate.html"
    page.write_text(simulated_validation_page())
    check_page(page, ("parasim-validate-timelines", "parasim-validate-scatter",
                      "parasim-validate-memory"))


def test_a_broken_page_is_caught(tmp_path):
    """The check itself: a page whose script throws fails it."""
    page = tmp_path / "broken.html"
    page.write_text("<html><body><div id='x'></div><script>undefinedName();</script>"
                    "</body></html>")
    dom, console = open_in_chromium(page)
    assert len(console) == 1 and "undefinedName" in console[0]
    assert not drawn(dom, "x")
