"""What every parasim HTML page shares: plotly.js deflated inside the page, its figures drawn
once it is unpacked, and log axes labelled at readable values.

plotly.js is 4.8 MB as text; deflated and base64-coded it is about 2 MB, so a page of a few
figures stays under 3 MB and still opens offline (the browser's DecompressionStream unpacks it).
A figure travels as its JSON in a `<script type="application/json">` beside its div.
Deterministic: zlib at a fixed level, fixed div ids, no timestamps.
"""

from __future__ import annotations

import base64
import math
import zlib
from functools import lru_cache

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

ZLIB_LEVEL = 9
LIBRARY_ID = "parasim-plotly"
FIGURE_CLASS = "parasim-figure"
DECADES_FOR_STEPS = 3
"""Up to this many decades a log axis is labelled at 1, 2, 5 x 10^k (every digit under a
decade); beyond, at powers of ten."""

_LOADER = (
    "(async function () {\n"
    "  \"use strict\";\n"
    f"  const bin = atob(document.getElementById(\"{LIBRARY_ID}\").textContent.trim());\n"
    "  const bytes = new Uint8Array(bin.length);\n"
    "  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);\n"
    "  const stream = new Blob([bytes]).stream()"
    ".pipeThrough(new DecompressionStream(\"deflate\"));\n"
    "  const library = document.createElement(\"script\");\n"
    "  library.textContent = await new Response(stream).text();\n"
    "  document.head.appendChild(library);\n"
    f"  for (const spec of document.querySelectorAll(\"script.{FIGURE_CLASS}\")) {{\n"
    "    const fig = JSON.parse(spec.textContent);\n"
    "    await Plotly.newPlot(spec.dataset.div, fig.data, fig.layout, {responsive: true});\n"
    "  }\n"
    "})();\n")


@lru_cache(maxsize=1)
def plotly_b64() -> str:
    """plotly.js, deflated and base64-coded (computed once per process: ~0.3 s)."""
    return base64.b64encode(zlib.compress(get_plotlyjs().encode("utf-8"),
                                          ZLIB_LEVEL)).decode("ascii")


def figure_html(div_id: str, fig: go.Figure) -> str:
    """The figure's div and its JSON, drawn by `plotly_scripts` once plotly.js is unpacked.
    Every '<' in the JSON is written as its escape, so no text can end the script early."""
    spec = pio.to_json(fig, validate=False, engine="json").replace("<", "\\u003c")
    height = fig.layout.height
    style = f"height:{int(height)}px;width:100%" if height else "width:100%"
    return (f"<div id=\"{div_id}\" class=\"plotly-graph-div\" style=\"{style}\"></div>\n"
            f"<script type=\"application/json\" class=\"{FIGURE_CLASS}\" "
            f"data-div=\"{div_id}\">{spec}</script>")


def plotly_scripts() -> str:
    """plotly.js (deflated) and the loader that unpacks it and draws every figure: at the end
    of the page's body, after the figures' divs."""
    return (f"<script id=\"{LIBRARY_ID}\" type=\"application/octet-stream\">{plotly_b64()}"
            f"</script>\n<script>{_LOADER}</script>")


def log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Tick values and labels for a log axis showing [lo, hi] (both > 0): 1, 2, 5 x 10^k over
    up to DECADES_FOR_STEPS decades, powers of ten beyond; every label a whole number as
    written, never plotly's minor digits ("2" beside "100")."""
    if not (0 < lo <= hi and math.isfinite(hi)):
        raise ValueError(f"log axis range {lo}..{hi} must be positive and finite")
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    if math.log10(hi / lo) > DECADES_FOR_STEPS:
        inside = _within([10.0**k for k in range(first, last + 1)], lo, hi)
    else:  # 1-2-5; under a decade, where that leaves fewer than 3 labels, every digit
        inside = _within(_steps(first, last, (1, 2, 5)), lo, hi)
        if len(inside) < 3:
            inside = _within(_steps(first, last, tuple(range(1, 10))), lo, hi)
    return inside, [tick_text(v) for v in inside]


def _steps(first: int, last: int, digits: tuple[int, ...]) -> list[float]:
    # digit * 10^k written as a decimal (0.2, not 0.20000000000000001)
    return [float(f"{d}e{k}") for k in range(first, last + 1) for d in digits]


def _within(values: list[float], lo: float, hi: float) -> list[float]:
    return [v for v in values if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)]


def tick_text(value: float) -> str:
    """A tick's label: 0.002, 0.5, 20, 1000, 1e+06 (plain up to six digits)."""
    return f"{value:.6g}" if 1e-4 <= value < 1e6 else f"{value:.0e}"


def log_axis_ticks(lo: float, hi: float) -> dict[str, object]:
    """The keyword arguments of `update_xaxes`/`update_yaxes` for such an axis."""
    values, texts = log_ticks(lo, hi)
    return {"type": "log", "tickmode": "array", "tickvals": values, "ticktext": texts}
