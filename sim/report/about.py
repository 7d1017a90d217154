"""What a config file says about itself: its opening comment, carried into the step report so
that a shipped example's caveats (DeepSeek-V3's: DualPipe and FP8 not modelled, so its MFU is
low) travel with the figures they qualify, and not only in the TOML."""

from __future__ import annotations

import html
from pathlib import Path

MAX_CHARS = 4000
"""A longer opening comment is cut here (the page is not the place for a manual)."""


def opening_comment(path: str | Path) -> str:
    """The comment lines before the first key or table of the TOML at `path`, without their
    '#', as paragraphs (a blank comment line ends one); lines indented as commands (four
    spaces) are left out. '' when it has none or cannot be read."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    paragraphs: list[list[str]] = [[]]
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        text = stripped[1:]
        if not text.strip():
            paragraphs.append([])
        elif not text.startswith("    "):
            paragraphs[-1].append(text.strip())
    text = "\n\n".join(" ".join(p) for p in paragraphs if p)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS].rsplit(" ", 1)[0] + " ..."


def about_html(comment: str) -> str:
    """The comment as the page's 'About this config' section ('' for none)."""
    if not comment:
        return ""
    paragraphs = "".join(f"<p class='note'>{html.escape(p)}</p>" for p in comment.split("\n\n"))
    return f"<h2>About this config (its opening comment)</h2>\n{paragraphs}"
