"""Transformer layers per virtual stage, as Megatron-Core assigns them.

Virtual stage k = vp_stage * pp + pp_rank. Four ways, as in megatron/core/transformer/
transformer_block.py (get_num_layers_to_build) and transformer_layer.py
(get_transformer_layer_offset):

* even: L / (pp * vp) layers a stage;
* `pp_first_layers` / `pp_last_layers` (--decoder-first/last-pipeline-num-layers): each chunk
  of the first (last) rank holds that count / vp, the other ranks' chunks split the rest;
* `account_for_embedding` / `account_for_loss` (--account-for-embedding/loss-in-pipeline-split):
  the embedding and the loss count as one layer each, L + E + L' is split evenly, and the first
  (last) virtual stage builds one transformer layer fewer — Llama 3.1 405B's 126 layers fill
  PP 8 x VP 8 = 64 stages of 2 (the first holds E + 1, the last 1 + L);
* `pipeline_layout` (--pipeline-model-parallel-layout, `traces.pipeline_layout`): stated.

MTP depths (`traces.mtp`) are layers L .. L + D - 1 at the end of the last virtual stage.

`Split.counts` is computed once per distinct split (cached); `num_layers_to_build` and
`layer_offset` are Megatron-Core's two functions, kept apart so that a test can check that the
offsets are the running sums of the counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from itertools import accumulate

from traces.pipeline_layout import StageSpec, parse_pipeline_layout


@dataclass(frozen=True, slots=True)
class Split:
    """The `[parallel]` keys that place layers on stages, and the model's layer count."""

    layers: int
    pp: int
    vp: int = 1
    first: int = 0
    last: int = 0
    embedding: bool = False
    loss: bool = False
    layout: str = ""
    mtp: int = 0
    """The model's MTP depths (`traces.mtp`): layers L .. L + mtp - 1 of the stage holding the
    loss (the `m` of a layout, which `traces.split_rules` keeps there)."""

    @property
    def uneven(self) -> bool:
        return bool(self.first or self.last)

    @property
    def accounted(self) -> int:
        """The layer count Megatron-Core splits: L, plus one each for an accounted embedding
        and loss."""
        return self.layers + self.embedding + self.loss

    def counts(self) -> tuple[int, ...]:
        """Transformer layers of each virtual stage, in stage order."""
        return _counts(self)

    def starts(self) -> tuple[int, ...]:
        """The first layer of each virtual stage (the running sums of `counts`), and L."""
        return _starts(self)

    def stages(self) -> tuple[StageSpec, ...] | None:
        """The parsed `pipeline_layout`, or None without one."""
        return _parsed(self.layout) if self.layout else None


@cache
def _parsed(text: str) -> tuple[StageSpec, ...]:
    return parse_pipeline_layout(text)


@cache
def _counts(split: Split) -> tuple[int, ...]:
    stages = split.stages()
    if stages is not None:
        return tuple(s.layers + s.mtp for s in stages)
    built = [num_layers_to_build(split, k % split.pp, k // split.pp)
             for k in range(split.pp * split.vp)]
    built[-1] += split.mtp  # Megatron-Core's default: MTP on the post-process stage
    return tuple(built)


@cache
def _starts(split: Split) -> tuple[int, ...]:
    return (0, *accumulate(split.counts()))


def num_layers_to_build(split: Split, pp_rank: int, vp_stage: int) -> int:
    """Megatron-Core's get_num_layers_to_build for (pp_rank, vp_stage), without a layout string:
    the rank's share of the (accounted) layers, divided by vp, less one on the first (last)
    virtual stage for an accounted embedding (loss)."""
    first, last = pp_rank == 0, pp_rank == split.pp - 1
    if split.uneven:
        left, ranks = split.layers - split.first - split.last, \
            split.pp - (split.first > 0) - (split.last > 0)
        per_rank = left // ranks if ranks > 0 else 0
        if first and split.first:
            per_rank = split.first
        if last and split.last:
            per_rank = split.last
    else:
        per_rank = split.accounted // split.pp
    build = per_rank // split.vp
    if split.embedding and first and vp_stage == 0:
        build -= 1
    if split.loss and last and vp_stage == split.vp - 1:
        build -= 1
    return build


def layer_offset(split: Split, pp_rank: int, vp_stage: int) -> int:
    """Megatron-Core's get_transformer_layer_offset for (pp_rank, vp_stage), without a layout
    string: the index of the stage's first transformer layer."""
    if split.pp == 1:
        return 0
    if split.uneven:
        return _uneven_offset(split, pp_rank, vp_stage)
    total = split.accounted
    offset = vp_stage * (total // split.vp) + pp_rank * (total // split.pp // split.vp)
    if split.embedding and not (pp_rank == 0 and vp_stage == 0):
        offset -= 1  # the embedding took the first place
    return offset


def _uneven_offset(split: Split, pp_rank: int, vp_stage: int) -> int:
    """The offset with pp_first_layers / pp_last_layers (Megatron-Core's uneven branch)."""
    middle = split.layers - split.first - split.last
    middle_ranks = split.pp - (split.first > 0) - (split.last > 0)
    middle_rank = pp_rank - 1 if split.first else pp_rank
    if split.vp > 1:
        first_chunk, last_chunk = split.first // split.vp, split.last // split.vp
        middle_chunks = middle // split.vp
        base = vp_stage * (first_chunk + middle_chunks + last_chunk)
        if pp_rank == 0:
            return base
        share = middle_chunks // middle_ranks if middle_ranks else 0
        return base + first_chunk + middle_rank * share
    per_rank = middle // middle_ranks if middle_ranks else 0
    return 0 if pp_rank == 0 else middle_rank * per_rank + split.first
