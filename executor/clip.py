"""The end of the step before the optimizer: fp16's found-inf check, the gradients' global
norm and the clip (Megatron-LM's clip_grad_norm_fp32; torch.nn.utils.clip_grad_norm_).

Each rank sums the squares of the gradients it updates, counting every parameter of the model
once: a parameter every TP rank holds whole (layer norms, row-parallel biases, positions)
counts on TP rank 0 only, and the last stage's copy of tied word embeddings not at all (the
first stage's counts). Where the statistics' group spans DP replicas whose gradients are whole
(ZeRO 0 with EP > 1), only the first replica counts (`counted`); the routed experts count on
their own terms (`executor.experts`). The plan's `GradStat(NORM)` all-reduce sums the squares
over the ranks that hold distinct gradients (`traces.plan.optimizer.grad_stats_group`), so
every rank gets the global norm; `clip` then scales its gradients by
min(1, max_norm / (norm + 1e-6)), as clip_grad_norm_ does. fp16: `check_inf` flags a
non-finite gradient, the `GradStat(FOUND_INF)` all-reduce takes the max, and the optimizer
skips the step if any rank found one.
"""

from __future__ import annotations

import torch

from executor.flat import Bucket, FlatLayout, Shards
from executor.params import EMBED, HEAD


def counted_mask(flat: FlatLayout, tp_rank: int, tied: bool, counted: bool = True
                 ) -> torch.Tensor:
    """Over the rank's flat parameters: those its norm counts (module docstring); none unless
    `counted`."""
    mask = torch.full((flat.total,), counted, dtype=torch.bool)
    if tp_rank != 0:
        for a, b in flat.replicated_ranges():
            mask[a:b] = False
    if tied and (HEAD, "output") in flat.param_range and EMBED not in flat.units:
        a, b = flat.param_range[(HEAD, "output")]
        mask[a:b] = False
    return mask


class GradClip:
    """One rank's norm, clip and found-inf flag, over the gradient segments the optimizer
    reads (`GradStore.optimizer_grads`: whole buckets, or this rank's slice of each)."""

    def __init__(self, flat: FlatLayout, buckets: list[Bucket], shards: Shards | None, *,
                 tp_rank: int, tied: bool, max_norm: float, device: torch.device,
                 counted: bool = True) -> None:
        mask = counted_mask(flat, tp_rank, tied, counted)
        ranges = [(b.start, b.end) for b in buckets] if shards is None else shards.flat_slice
        self.masks = [mask[a:b].to(device) for a, b in ranges]
        self.max_norm = max_norm
        self.norm_sq = torch.zeros(1, dtype=torch.float32, device=device)
        self.found_inf = torch.zeros(1, dtype=torch.float32, device=device)

    @torch.no_grad()
    def check_inf(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """1 if any of the rank's gradients is inf or NaN, else 0 (to be max-reduced)."""
        bad = any(not bool(torch.isfinite(g).all()) for g in grads)
        self.found_inf.fill_(1.0 if bad else 0.0)
        return self.found_inf

    @torch.no_grad()
    def square_sum(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The sum of squares of the counted gradients, in fp32 (to be sum-reduced)."""
        total = torch.zeros((), dtype=torch.float32, device=self.norm_sq.device)
        for g, mask in zip(grads, self.masks):
            assert g.numel() == mask.numel(), "a gradient segment matches its mask"
            total += g.float()[mask].square().sum()
        self.norm_sq.copy_(total.reshape(1))
        return self.norm_sq

    @torch.no_grad()
    def clip(self, grads: list[torch.Tensor]) -> float:
        """Scale every gradient by clip_grad_norm_'s clamped factor (its fp32 arithmetic);
        the global norm."""
        norm = self.norm_sq.sqrt()
        factor = (self.max_norm / (norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(factor.to(g.dtype))
        return float(norm)

    @property
    def skip(self) -> bool:
        """fp16: some rank found a non-finite gradient; the optimizer skips this step."""
        return bool(self.found_inf.item() > 0)
