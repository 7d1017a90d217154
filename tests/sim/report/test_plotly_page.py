"""The shared page pieces (sim/report/plotly_page.py): plotly.js deflated once per page and
the figures drawn from their JSON; log axes labelled at 1-2-5 or powers of ten."""

from __future__ import annotations

import base64
import json
import re
import zlib

import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

from sim.report.plotly_page import figure_html, log_ticks, plotly_scripts


@pytest.mark.parametrize(("lo", "hi", "labels"), [
    (0.074, 66.0, ["0.1", "0.2", "0.5", "1", "2", "5", "10", "20", "50"]),  # goodput's axis
    (1.2, 9000.0, ["10", "100", "1000"]),  # over 3 decades: powers of ten
    (0.003, 5e6, ["0.01", "0.1", "1", "10", "100", "1000", "10000", "100000", "1e+06"]),
    (17.7, 40.0, ["20", "30", "40"]),  # under a decade: every digit, each a whole label
    (0.5, 2.2, ["0.5", "1", "2"]),
])
def test_log_ticks_are_1_2_5_or_powers_of_ten(lo, hi, labels):
    values, texts = log_ticks(lo, hi)
    assert texts == labels
    assert all(lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9) for v in values)
    assert [float(t) for t in texts] == values


@pytest.mark.parametrize(("lo", "hi"), [(0, 1), (-1, 1), (2, 1), (1, float("inf"))])
def test_a_log_axis_needs_a_positive_finite_range(lo, hi):
    with pytest.raises(ValueError, match="must be positive and finite"):
        log_ticks(lo, hi)


def test_plotly_travels_deflated_and_each_figure_as_its_json():
    scripts = plotly_scripts()
    blob = re.search(r'<script id="parasim-plotly"[^>]*>([^<]*)</script>', scripts)
    assert blob is not None
    assert zlib.decompress(base64.b64decode(blob[1])).decode() == get_plotlyjs()
    assert len(blob[1]) < len(get_plotlyjs()) / 2
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name="</script><b>"), layout={"height": 300})
    html = figure_html("d1", fig)
    assert html.count("</script>") == 1 and "</script><b>" not in html  # no early end
    spec = html[html.index(">", html.index("<script")) + 1:html.rindex("</script>")]
    assert json.loads(spec)["data"][0]["name"] == "</script><b>"
    assert html.startswith('<div id="d1" class="plotly-graph-div" style="height:300px;')
