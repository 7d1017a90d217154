"""What the lanes' hover shows for a communication op, read off the data the page hovers on:
the op (what it carries, kind, bytes, group, algorithm), its start and duration, and the bus
bandwidth the script writes (`report.js` `describe`: factor * bytes / duration, factor as
nccl-tests counts it; 1 for a send or receive, so there it is bytes / duration).

    pytest tests/sim/report/test_report_hover.py -q

tests/bench/bench_report.py hovers such an op with the mouse in Chromium and prints the text.
"""

import numpy as np
import pytest

from sim.report import read_payload, render_report
from sim.report.binned import decode_row
from sim.simulate import predict
from tests.sim.report.report_cases import TP2_PP2_DP2, experiment, lane_name, typed
from traces.ops import OpKind

KIB, MIB = 1024, 1024**2


def nccl_factor(kind: OpKind, n: int) -> float:
    """nccl-tests' bus-bandwidth factor, written out here."""
    if kind is OpKind.ALL_REDUCE:
        return 2 * (n - 1) / n
    if kind in (OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER, OpKind.ALL_TO_ALL):
        return (n - 1) / n
    return 1.0


def size_text(size: float) -> str:
    return (f"{size / MIB:.1f}MiB" if size >= MIB else f"{size / KIB:.1f}KiB" if size >= KIB
            else f"{size:.0f}B")


@pytest.fixture(scope="module")
def hovered():
    exp = experiment(TP2_PP2_DP2)
    summary, times = predict(exp)
    payload = read_payload(render_report(exp, summary, times))
    spec = next(s for s in payload["binned"] if s["div"] == "parasim-lanes")
    names = [t["meta"] for t in payload["figures"]["parasim-lanes"]["data"]]
    return times, spec, names


def test_communication_hover_holds_bytes_and_bus_bandwidth(hovered):
    times, spec, names = hovered
    seen_kinds = set()
    for trace in spec["traces"]:
        where, lane = names[trace["index"]].split(" · ")
        row = trace["rows"][0]
        if lane == "compute":
            assert "what" not in row  # kernels: no bytes to show
            continue
        assert trace["index"] in spec["describe"]
        rank = int(where.split(" r")[1])
        ops = [(op, s, e) for op, s, e in zip(times.plan.ops[rank], times.starts[rank],
                                              times.ends[rank]) if lane_name(op) == lane]
        starts, ends = decode_row(row)
        what = typed(row["what"])
        assert len(ops) == len(starts) == len(what)
        for (op, s, e), s_ns, e_ns, w in zip(ops, starts, ends, what, strict=True):
            text, factor_bytes = spec["what"][int(w)]
            n = 2 if op.kind.is_p2p else len(op.group)
            assert size_text(op.size_bytes) in text and f"{n} ranks" in text
            assert (str(op.kind) in text) or (op.kind.is_p2p and "send/recv" in text)
            assert factor_bytes == pytest.approx(nccl_factor(op.kind, n) * op.size_bytes)
            assert s_ns == round(s * 1e9) and e_ns == round(e * 1e9)  # start, duration
            # the bandwidth the hover writes, within the ns rounding of the duration
            duration = e - s
            if duration > 1e-6:
                shown = factor_bytes / ((e_ns - s_ns) / 1e9)
                assert shown == pytest.approx(nccl_factor(op.kind, n) * op.size_bytes
                                              / duration, rel=2e-3)
            seen_kinds.add("p2p" if op.kind.is_p2p else str(op.kind))
    assert {"p2p", "all_reduce"} <= seen_kinds


def test_a_send_shows_bytes_over_its_duration(hovered):
    times, spec, names = hovered
    trace = next(t for t in spec["traces"]
                 if names[t["index"]].split(" · ")[1].startswith("send"))
    starts, ends = decode_row(trace["rows"][0])
    text, factor_bytes = spec["what"][int(typed(trace["rows"][0]["what"])[0])]
    assert text.startswith("p2p ") and "send/recv" in text
    size = float(text.split(" · ")[2].removesuffix("MiB").removesuffix("KiB"))
    assert factor_bytes == pytest.approx(size * (MIB if "MiB" in text else KIB), rel=1e-3)
    assert np.all(ends > starts)
