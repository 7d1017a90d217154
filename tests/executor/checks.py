"""Checks of executor results against the single-process reference (test-process side)."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from executor.flat import FlatLayout
from executor.params import EMBED, HEAD, tp_shard
from executor.reference import ReferenceRun
from traces.expert_grid import ep_coord
from traces.layout import Layout
from traces.model import ModelSpec

LOSS_REL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-7
# With the tests' AdamW eps (workers.ADAMW) an update moves by at most lr/eps = 10 times a
# gradient's error: ~1e-7 for rounding, ~1e-3 for a wrong gradient.
PARAM_ATOL = 1e-6


def ref_key(model: ModelSpec, unit: str, name: str) -> tuple[str, str]:
    """The reference's name for a rank's parameter (a tied output layer is the embedding)."""
    if unit == HEAD and name == "output" and model.tied_embeddings:
        return (EMBED, "word")
    return (unit, name)


def expected_flat(model: ModelSpec, layout: Layout, rank: int,
                  tensors: dict[tuple[str, str], torch.Tensor]) -> torch.Tensor:
    """Full reference tensors cut to one rank's TP shards, in its flat order."""
    c = layout.coords(rank)
    flat = FlatLayout(model, layout, c.pp)
    parts = [tp_shard(model, s.name, tensors[ref_key(model, u, s.name)], layout.tp, c.tp)
             .reshape(-1) for u in flat.units for s in flat.specs[u]]
    return torch.cat(parts)


def check_training(model: ModelSpec, layout: Layout, results: list[dict[str, Any]],
                   run: ReferenceRun) -> dict[str, float]:
    """Losses of every step, step-1 reduced gradients (when the results have them) and final
    parameters of every rank equal the reference's (a rank's routed experts: its EP shard);
    returns the largest deviations seen."""
    worst = {"loss": 0.0, "grad": 0.0, "param": 0.0}
    for step, ref_loss in enumerate(run.losses):
        # per (DP replica, micro-batch), the mean over its CP ranks (each holds s/cp tokens)
        by_sequence: dict[tuple[int, int], list[float]] = {}
        last = layout.num_stages - 1  # on pp - 1, but rank 0 under zbv, both under dualpipe
        for res in results:
            if last in layout.stages_of_rank(res["coords"].pp) and res["coords"].tp == 0:
                for mb, v in res["losses"][step].items():
                    by_sequence.setdefault((res["coords"].dp, mb), []).append(v)
        assert len(by_sequence) == layout.dp * layout.num_microbatches
        assert all(len(v) == layout.cp for v in by_sequence.values())
        values = [statistics.fmean(v) for v in by_sequence.values()]
        loss = statistics.fmean(values)
        worst["loss"] = max(worst["loss"], abs(loss - ref_loss) / ref_loss)
        assert abs(loss - ref_loss) <= LOSS_REL * ref_loss, (step, loss, ref_loss)
    for rank, res in enumerate(results):
        grads = expected_flat(model, layout, rank, run.first_grads)
        for (lo, hi), got in zip(res.get("segments", ()), res.get("grads") or ()):
            torch.testing.assert_close(got, grads[lo:hi], rtol=GRAD_RTOL, atol=GRAD_ATOL,
                                       msg=f"rank {rank} gradients [{lo}, {hi})")
            worst["grad"] = max(worst["grad"], float((got - grads[lo:hi]).abs().max()))
        tp_rank = res["coords"].tp
        for unit, tensors in res["params"].items():
            for name, got in tensors.items():
                full = run.params[ref_key(model, unit, name)]
                want = full.chunk(layout.ep)[ep_coord(layout, rank)] \
                    if name.startswith("experts.") else \
                    tp_shard(model, name, full, layout.tp, tp_rank)
                diff = float((got - want).abs().max())
                worst["param"] = max(worst["param"], diff)
                assert diff <= PARAM_ATOL, f"rank {rank} {unit}.{name}: off by {diff:.2e}"
    return worst
