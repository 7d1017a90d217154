"""Under DualPipe rank r and rank pp - 1 - r are mirrors (issue 33): each holds stages r and
pp - 1 - r, one of each copy, and runs the other's steps with the copies swapped
(`traces.dualpipe_order`: phase ^= is_in_second_half). On a cluster alike under the swap the
simulated ranks agree exactly: the same op durations, the same end, rank for rank. This is
what the fold of the mirror pairs (`docs/dualpipe-mirror-fold.md`,
tests/sim/test_dualpipe_mirror_fold.py) rests on; the unfolded run shows it."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from sim.config import experiment_from_dict
from sim.simulate import predict
from traces.ops import Stream
from traces.plan import build

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


def _mirror_stream(value: str) -> str:
    """A pipeline stream of one copy named as the other copy's (`send_next` <-> `send_next_v`)."""
    if not value.startswith(("send_", "recv_")):
        return value
    return value[:-2] if value.endswith("_v") else value + "_v"


@pytest.mark.parametrize("parallel", [
    {}, {"pp": 8, "dp": 1, "ep": 1, "global_batch": 16, "zero": 0},
    {"overlap_moe_comm": True}])
def test_mirror_is_a_relabelling(parallel: dict) -> None:
    """The fold's footing, op by op: rank x's ops and its mirror's agree position by position
    once micro-batch m is renamed (m + M/2) mod M (the copies swap halves; the gradient
    reduce-scatters keep their label, the last micro-batch), the streams of the two copies
    swap, and peers and groups are mirrored; and the unfolded run gives each position the same
    start and end. So the mirrored half's timelines are the simulated half's, copied."""
    config = copy.deepcopy(CONFIG)
    config["parallel"].update(parallel)
    exp = experiment_from_dict(config)
    layout = exp.layout
    ops = build(exp.model, layout).ops
    _, times = predict(exp, fold=False)
    per_rank = layout.global_batch // layout.dp // layout.micro_batch

    def mirror(x: int) -> int:
        c = layout.coords(x)
        return layout.rank(c.tp, c.cp, c.dp, layout.pp - 1 - c.pp)

    for x in range(layout.world):
        y = mirror(x)
        assert len(ops[x]) == len(ops[y])
        for o, p in zip(ops[x], ops[y], strict=True):
            keep = o.microbatch is None or o.name == "grads"
            mb = o.microbatch if keep else (o.microbatch + per_rank // 2) % per_rank
            assert replace(p, group=()) == replace(
                o, microbatch=mb, stream=Stream(_mirror_stream(o.stream.value)), group=(),
                peer=None if o.peer is None else mirror(o.peer))
            assert sorted(p.group) == sorted(mirror(g) for g in o.group)
        assert times.starts[x] == times.starts[y] and times.ends[x] == times.ends[y]
