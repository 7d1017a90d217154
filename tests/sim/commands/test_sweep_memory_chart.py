"""The sweep report's memory chart: its bars are in the unit its axis names, the unit the table
writes the peaks in, and a GPU far larger than every peak does not flatten the bars."""

import dataclasses

from sim.config import example_path
from sim.report.memory_scale import CAPACITY_SPAN
from sim.settings import parse_settings
from sim.simulate import predict, size_text
from sim.sweep.points import Point, sweep_experiments, sweep_rows, sweep_settings
from sim.sweep.report import memory_figure

TINY = example_path("gpt-tiny-localhost.toml")
UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def points(*settings):
    swept = sweep_settings("parallel.micro_batch", ["1", "2"])
    exps = sweep_experiments(TINY, parse_settings(list(settings)), swept)
    return [Point(value=s.value, exp=e, summary=predict(e)[0]) for e, s in zip(exps, swept)]


def chart(pts):
    fig = memory_figure("parallel.micro_batch", pts).to_plotly_json()
    bars, capacity = (next(t for t in fig["data"] if t["name"].startswith(start))
                      for start in ("peak memory", "GPU memory"))
    return bars, capacity, fig["layout"]["yaxis2"]["title"]["text"]


def test_mib_peaks_are_drawn_in_mib_on_a_mib_axis_as_the_table_writes_them():
    pts = points()  # 5.3 and 6.0 MiB on a 3 GiB GPU
    bars, capacity, title = chart(pts)
    assert title == "peak memory (MiB)"
    assert list(bars["y"]) == [p.summary.peak_memory_bytes / 2**20 for p in pts]
    for y, row in zip(bars["y"], sweep_rows(pts)):  # "5.3 MiB of 3.0 GiB"
        assert row[4].split(" of ")[0] == f"{y:.1f} MiB"
    # the 3 GiB line would make 6 MiB bars 0.2% of the axis: it starts hidden, named in full
    assert pts[0].summary.memory_capacity_bytes > CAPACITY_SPAN * max(bars["y"]) * 2**20
    assert capacity["visible"] == "legendonly"
    assert capacity["name"] == "GPU memory 3.0 GiB (off the scale: click to show)"
    assert list(capacity["y"]) == [3 * 1024.0, 3 * 1024.0]  # in MiB too


def test_a_gpu_near_the_peaks_is_drawn_beside_them_in_the_same_unit():
    pts = points("cluster.gpu_memory=5700KiB")
    bars, capacity, title = chart(pts)
    assert title == "peak memory (MiB)" and capacity["name"] == "GPU memory (MiB)"
    assert capacity.get("visible", True) is True
    assert list(capacity["y"]) == [5700 / 1024] * 2
    assert bars["marker"]["color"] == ["#4c78a8", "#e45756"]  # micro-batch 2 does not fit


def test_gib_peaks_are_drawn_in_gib():
    pts = [dataclasses.replace(p, summary=dataclasses.replace(
        p.summary, peak_memory_bytes=p.summary.peak_memory_bytes * 2**10)) for p in points()]
    bars, capacity, title = chart(pts)
    unit = size_text(max(p.summary.peak_memory_bytes for p in pts))[-3:]
    assert unit == "GiB" and title == f"peak memory ({unit})"
    assert list(bars["y"]) == [p.summary.peak_memory_bytes / UNITS[unit] for p in pts]
    assert capacity["name"] == "GPU memory (GiB)" and list(capacity["y"]) == [3.0, 3.0]
