"""Under DualPipe rank r and rank pp - 1 - r are mirrors (issue 33): each holds stages r and
pp - 1 - r, one of each copy, and runs the other's steps with the copies swapped
(`traces.dualpipe_order`: phase ^= is_in_second_half). On a cluster alike under the swap the
simulated ranks agree exactly: the same op durations, the same end, rank for rank. This is
what a fold of the mirror pairs (not built yet) would rest on; the unfolded run shows it."""

from __future__ import annotations

import copy

import pytest

from sim.config import experiment_from_dict
from sim.simulate import predict

CONFIG = {
    "model": {"layers": 8, "hidden": 1024, "heads": 8, "seq_len": 1024, "vocab": 4096,
              "ffn": "swiglu", "ffn_hidden": 2048, "experts": 8, "top_k": 2,
              "moe_ffn_hidden": 512, "dense_layers": 0, "bias": False,
              "tied_embeddings": False},
    "parallel": {"pp": 4, "schedule": "dualpipe", "dp": 2, "ep": 2, "global_batch": 16,
                 "zero": 1},
    "cluster": {"preset": "dgx-h800", "nodes": 1},
}


@pytest.mark.parametrize("parallel", [
    {}, {"pp": 8, "dp": 1, "ep": 1, "global_batch": 16, "zero": 0},
    {"overlap_moe_comm": True}])
def test_mirror_ranks_run_alike(parallel: dict) -> None:
    config = copy.deepcopy(CONFIG)
    config["parallel"].update(parallel)
    exp = experiment_from_dict(config)
    layout = exp.layout
    _, times = predict(exp)
    for r in range(layout.pp // 2):
        a, b = layout.rank(pp=r), layout.rank(pp=layout.pp - 1 - r)
        spans = [sorted(e - s for s, e in zip(times.starts[x], times.ends[x], strict=True))
                 for x in (a, b)]
        assert spans[0] == spans[1]
        assert max(times.ends[a]) == max(times.ends[b])
