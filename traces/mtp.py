"""Multi-token prediction (`[model] mtp_layers`, Megatron-Core's --mtp-num-layers).

DeepSeek-V3 (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, §2.2) adds D sequential MTP
modules after the main model; Megatron-Core builds them as MultiTokenPredictionLayer
(megatron/core/transformer/multi_token_prediction.py). Depth k of b·s tokens:

* the embedding of the tokens shifted by k, looked up in the main model's (shared) table;
* `enorm` of that embedding and `hnorm` of depth k-1's hidden state (RMSNorms, h each);
* their concatenation through `eh_proj`, a column-parallel linear 2h -> h without bias
  (gather_output False, then an all-gather over TP, and a scatter to SP's sequence shard);
* one transformer layer built from the main model's last layer's spec (MoE when that one
  is), here layer index `layers + k` so every pass treats it as a layer;
* `final_layernorm` (h), then the shared output layer's logits and cross-entropy.

Parameters of one depth: its layer, 3 norms and 2h·h (eh_proj, split by t); the embedding
and output weights are the main model's (the MTP stage holds a copy of the embedding, as a
tied output layer's last stage does). Megatron-LM's num_floating_point_operations
(megatron/training/training.py) counts each depth as one more layer of the last layer's kind,
plus 6·(3h + 2h²) per token for its norms and eh_proj, plus one more logits GEMM.

Placement: the virtual stage holding `m` in `pipeline_layout`, else the last stage (Megatron-
Core's default: MTP on the post-process stage). Megatron-Core's rules: all MTP layers in one
virtual stage, the last chunk of its rank; parasim runs them with the loss (Megatron-Core's
standalone MTP stage, `m` on another rank than `L`, is refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from traces.errors import ConfigError, show


class ModelSpec(Protocol):
    """The `traces.model.ModelSpec` fields and counts MTP reads (a protocol: the model module
    imports this one)."""

    @property
    def layers(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def vocab(self) -> int: ...
    @property
    def mtp_layers(self) -> int: ...
    @property
    def tied_embeddings(self) -> bool: ...
    @property
    def norm_params(self) -> int: ...
    def layer_params(self, tp: int = 1, layer: int | None = None, ep: int = 1,
                     etp: int = 1) -> float: ...
    def attn_flops(self, micro_batch: int, tp: int = 1) -> float: ...
    def mlp_flops(self, micro_batch: int, tp: int = 1, layer: int | None = None) -> float: ...
    def head_flops(self, micro_batch: int, tp: int = 1) -> float: ...

MAX_MTP_LAYERS = 64
"""Far beyond any published depth (DeepSeek-V3: 1; MiMo: 1; Qwen3-Next: 1)."""


def check_mtp(m: ModelSpec) -> None:
    """`mtp_layers` is a whole count from 0 to MAX_MTP_LAYERS."""
    n = m.mtp_layers
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_MTP_LAYERS:
        raise ConfigError(f"model.mtp_layers: {show(n)} must be an integer from 0 to "
                          f"{MAX_MTP_LAYERS} (Megatron-Core's --mtp-num-layers; DeepSeek-V3: 1)")


def mtp_indices(m: ModelSpec) -> range:
    """The layer indices of the MTP depths' transformer layers: layers .. layers + D - 1."""
    return range(m.layers, m.layers + m.mtp_layers)


def mtp_extra_params(m: ModelSpec, tp: int = 1) -> float:
    """One depth's parameters besides its transformer layer: enorm, hnorm, final_layernorm
    (replicated) and eh_proj 2h·h (column-parallel, split by t, no bias)."""
    return 3 * m.norm_params + 2 * m.hidden * m.hidden / tp


def mtp_params(m: ModelSpec, tp: int = 1, ep: int = 1, etp: int = 1) -> float:
    """All MTP depths' own parameters on one TP rank (shared embedding and head excluded)."""
    return sum(m.layer_params(tp, i, ep, etp) + mtp_extra_params(m, tp) for i in mtp_indices(m))


def mtp_forward_flops(m: ModelSpec, micro_batch: int, tp: int = 1) -> float:
    """One micro-batch's MTP forward GEMM FLOPs: per depth its layer, eh_proj 2bs·2h·h and the
    shared head's logits 2bshV (divided by t)."""
    b, s, h = micro_batch, m.seq_len, m.hidden
    per = [m.attn_flops(b, tp) + m.mlp_flops(b, tp, i) + 4 * b * s * h * h / tp
           + m.head_flops(b, tp) for i in mtp_indices(m)]
    return sum(per)


def megatron_mtp_term(m: ModelSpec, global_batch: int) -> float:
    """Megatron-LM's MTP-only addend, `3 * 2 * mtp_num_layers * (3h + 2h^2)` per token: its
    norms (counted as 3h FLOPs) and eh_proj; the layers and logits join their own terms."""
    h = m.hidden
    return global_batch * m.seq_len * 6 * m.mtp_layers * (3 * h + 2 * h * h)


def embedding_copy(m: ModelSpec, stages: Sequence[int], tp: int) -> float:
    """The word embedding the MTP stage holds for its lookups when it does not run stage 0 and
    the output layer is not already that copy (untied): Megatron-Core's GPTModel builds the
    embedding where mtp_process is set, and finalize_model_grads all-reduces its gradient
    with stage 0's over the embedding group, as for tied embeddings."""
    if not m.mtp_layers or m.tied_embeddings or 0 in stages:
        return 0.0
    return m.vocab * m.hidden / tp


def mtp_stage_extra(m: ModelSpec, stages: Sequence[int], tp: int) -> float:
    """What the GPU running the MTP stage (the last) holds for MTP besides its layers: each
    depth's norms and eh_proj, and the embedding copy."""
    return m.mtp_layers * mtp_extra_params(m, tp) + embedding_copy(m, stages, tp)


def mtp_unit_extra(m: ModelSpec, layer: int, stages: Sequence[int], tp: int) -> float:
    """A plan unit's parameters besides its transformer layer: a depth's norms and eh_proj,
    and, with the first depth (whose lookup runs first), the embedding copy; 0 for a main
    layer."""
    if layer < m.layers:
        return 0.0
    return mtp_extra_params(m, tp) + (embedding_copy(m, stages, tp) if layer == m.layers
                                      else 0.0)
