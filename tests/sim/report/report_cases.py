"""Small experiments and page readers shared by the report tests (tests/sim/test_report*.py).

The readers decode what a report page carries (`sim.report.read_payload`) the way a browser
would, apart from the report's own code: plotly's typed arrays, the pipeline's pass points, the
binned rows, and a count of what plotly draws.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from sim.config import Experiment, experiment_from_dict
from traces.ops import Op, OpKind, Stream

# TP 2 x PP 4 on one DGX H100, 8 micro-batches of 1 under 1F1B: the pipeline of the issue.
PP4_M8 = {
    "model": {"layers": 8, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128},
    "parallel": {"tp": 2, "pp": 4, "dp": 1, "global_batch": 8},
    "cluster": {"preset": "dgx-h100", "nodes": 1},
}
# TP 2 x PP 2 x DP 2, 4 micro-batches, full recomputation: every lane and collective kind.
TP2_PP2_DP2 = {
    "model": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128},
    "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch": 8, "recompute": "full"},
    "cluster": {"preset": "dgx-h100", "nodes": 1},
}


def lane_name(op: Op) -> str:
    """Written apart from sim.report.timeline: collectives on the compute stream get their lane."""
    if op.stream == Stream.COMPUTE and op.kind is not OpKind.COMPUTE:
        return "compute/tp"
    return str(op.stream)


def experiment(config: dict[str, Any], name: str = "tiny-gpt", **parallel: Any) -> Experiment:
    data = {**config, "parallel": {**config["parallel"], **parallel}}
    return experiment_from_dict(data, name=name)


def typed(value: Any) -> np.ndarray:
    """A data array as plotly.py writes it: a list, or {dtype, bdata[, shape]}."""
    if not isinstance(value, dict):
        return np.asarray(value)
    array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    if "shape" in value:
        array = array.reshape([int(n) for n in str(value["shape"]).split(",")])
    return array


def pass_points(figure: dict[str, Any]) -> list[dict[str, Any]]:
    """The pipeline's passes as its hover points hold them."""
    out = []
    for trace in figure["data"]:
        meta = trace.get("meta") or {}
        if "passes" not in meta:
            continue
        data, rows = typed(trace["customdata"]), typed(trace["y"])
        for i, row in enumerate(rows):
            out.append({"kind": meta["passes"], "row": int(row), "mb": trace["text"][i],
                        "start": data[i, 0], "end": data[i, 1], "duration": data[i, 2],
                        "x": typed(trace["x"])[i], "hover": trace["hovertext"][i]})
    return out


def drawn_shapes(payload: dict[str, Any]) -> dict[str, int]:
    """What plotly draws, per figure: a bar per bar, a marker per point of a marker trace,
    a path per line or fill trace, an image per heatmap; hover-only points draw nothing."""
    counts = {}
    for div, figure in payload["figures"].items():
        n = 0
        for trace in figure["data"]:
            kind = trace.get("type", "scatter")
            mode = trace.get("mode", "")
            if kind in ("bar", "waterfall"):
                n += len(typed(trace.get("y", trace.get("x", []))))
            elif kind == "heatmap" or (kind == "scatter" and mode == "lines"):
                n += 1
            elif kind == "scatter" and ("markers" in mode or mode == "text"):
                n += len(typed(trace.get("x", [])))
        n += len(figure["layout"].get("shapes", []))
        counts[div] = n
    return counts
