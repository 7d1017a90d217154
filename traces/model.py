"""GPT-style decoder arithmetic: parameters, closed-form FLOPs, Megatron's step FLOPs.

Notation follows the Megatron-LM papers: b micro-batch, s sequence, h hidden, a heads,
l layers, V vocabulary, f MLP width (4h for GPT), t tensor-parallel degree. FLOPs count the
matrix multiplications only (2 FLOPs per multiply-add), as the papers do:

    attention forward   2bsh*3h (QKV) + 2bs^2h (QK^T) + 2bs^2h (AV) + 2bsh^2 (proj)
                                                                  = 8bsh^2 + 4bs^2h
    MLP forward         2bsh*f + 2bsf*h                           = 4bshf
    logits forward      2bshV
    backward            twice the forward of the same op

Layer norms, dropouts, residuals and GeLU add no FLOPs but move memory. So one step of global
batch B without recomputation is 72*B*s*l*h^2*(1 + s/(6h) + V/(12lh)) FLOPs, and
96*B*s*l*h^2*(1 + s/(6h) + V/(16lh)) with full recomputation (f = 4h). The per-kernel FLOPs
and HBM bytes the plan carries are in `traces.kernels`; they add up to these forms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from traces.errors import ConfigError, show

ATTENTIONS = ("flash", "unfused")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Upper bounds, far beyond any published model (GPT-3: 96 layers, h 12288, V 51200), that keep
# every count finite and every plan buildable.
MAX_DIMS = {"layers": 2**16, "hidden": 2**20, "heads": 2**16, "seq_len": 2**24, "vocab": 2**24,
            "ffn_hidden": 2**22}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A GPT-style decoder: pre-LN blocks of attention and a two-layer MLP."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn_hidden: int = 0
    """MLP width f; 0 means 4 * hidden."""
    dtype: str = "bf16"
    tied_embeddings: bool = True
    """Output layer shares the input embedding (Megatron GPT's default)."""
    attention: str = "flash"
    """The attention core's implementation: "flash" (one fused kernel; scores never stored) or
    "unfused" (Megatron-LM before 2023: QKᵀ, softmax, dropout and AV over b·a·s² scores)."""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"model.{name}: {show(value)} must be a positive integer")
            if value > MAX_DIMS[name]:
                raise ConfigError(f"model.{name}: {show(value)} is larger than {MAX_DIMS[name]:,}")
        if not isinstance(self.ffn_hidden, int) or isinstance(self.ffn_hidden, bool) or \
                not 0 <= self.ffn_hidden <= MAX_DIMS["ffn_hidden"]:
            raise ConfigError(f"model.ffn_hidden: {show(self.ffn_hidden)} must be a positive "
                              f"integer up to {MAX_DIMS['ffn_hidden']:,} (or 0 for 4 * hidden)")
        if self.ffn_hidden == 0:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"model.dtype: {show(self.dtype)} is not one of "
                              f"{', '.join(DTYPE_BYTES)}")
        if not isinstance(self.attention, str) or self.attention not in ATTENTIONS:
            raise ConfigError(f"model.attention: {show(self.attention)} is not one of "
                              f"{', '.join(ATTENTIONS)}")
        if not isinstance(self.tied_embeddings, bool):
            raise ConfigError(f"model.tied_embeddings: {show(self.tied_embeddings)} must be "
                              "true or false")
        if self.hidden % self.heads:
            raise ConfigError(f"model.hidden: {self.hidden} is not divisible by "
                              f"model.heads = {self.heads}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    # --- parameters -------------------------------------------------------------------------

    def layer_params(self, tp: int = 1) -> float:
        """Parameters of one block held by one tensor-parallel rank.

        Split by t: QKV (3h^2 + 3h), proj weight h^2, MLP weights 2hf and first bias f.
        Replicated: the proj and second MLP biases (h each) and two layer norms (2h each).
        """
        h, f = self.hidden, self.ffn_hidden
        return (4 * h * h + 3 * h + 2 * h * f + f) / tp + 6 * h

    def embedding_params(self, tp: int = 1) -> float:
        """Word embeddings (vocab-parallel) plus learned positions (replicated)."""
        return self.vocab * self.hidden / tp + self.seq_len * self.hidden

    def head_params(self, tp: int = 1) -> float:
        """Final layer norm plus the output projection (a copy of the embedding when tied)."""
        return 2 * self.hidden + self.vocab * self.hidden / tp

    def params_on_stages(self, stages: Sequence[int], num_stages: int, tp: int,
                         num_layers: int | None = None) -> float:
        """Parameters one GPU holds before ZeRO sharding when it runs virtual stages `stages`
        of `num_stages` at tensor parallelism `tp`: their layers (`num_layers` of them, or
        an even share), the embeddings with stage 0, the output layer with the last stage
        (with tied embeddings on another GPU, Megatron keeps a copy there and all-reduces its
        gradient with the first stage)."""
        if num_layers is None:
            num_layers = len(stages) * (self.layers // num_stages)
        params = num_layers * self.layer_params(tp)
        if 0 in stages:
            params += self.embedding_params(tp)
        if num_stages - 1 in stages:
            params += self.head_params_on_stages(stages, tp)
        return params

    def head_params_on_stages(self, stages: Sequence[int], tp: int) -> float:
        """The output layer's parameters on the GPU running the last stage among `stages`:
        just the final norm when the output weights are the embedding tensor itself (tied,
        and stage 0 on the same GPU)."""
        if self.tied_embeddings and 0 in stages:
            return 2 * self.hidden
        return self.head_params(tp)

    def num_params(self) -> float:
        """All distinct parameters (a tied output layer counted once)."""
        head = 2 * self.hidden if self.tied_embeddings else self.head_params()
        return self.layers * self.layer_params() + self.embedding_params() + head

    # --- FLOPs per micro-batch, per tensor-parallel rank ---------------------------------------

    def attn_flops(self, micro_batch: int, tp: int = 1) -> float:
        b, s, h = micro_batch, self.seq_len, self.hidden
        return (8 * b * s * h * h + 4 * b * s * s * h) / tp

    def attn_core_flops(self, micro_batch: int, tp: int = 1) -> float:
        """QK^T and AV only: what selective recomputation re-runs."""
        b, s, h = micro_batch, self.seq_len, self.hidden
        return 4 * b * s * s * h / tp

    def mlp_flops(self, micro_batch: int, tp: int = 1) -> float:
        return 4 * micro_batch * self.seq_len * self.hidden * self.ffn_hidden / tp

    def head_flops(self, micro_batch: int, tp: int = 1) -> float:
        return 2 * micro_batch * self.seq_len * self.hidden * self.vocab / tp

    def activation_bytes(self, micro_batch: int) -> float:
        """One micro-batch's b*s*h activation tensor (what pipeline stages send)."""
        return micro_batch * self.seq_len * self.hidden * self.dtype_bytes


def model_flops(model: ModelSpec, global_batch: int) -> float:
    """FLOPs of one step without recomputation: forward plus backward (twice forward)."""
    per_sample = model.layers * (model.attn_flops(1) + model.mlp_flops(1)) + model.head_flops(1)
    return 3 * global_batch * per_sample


def recompute_flops(model: ModelSpec, global_batch: int, recompute: str) -> float:
    """Extra forward FLOPs re-run in backward: whole blocks (full) or attention cores
    (selective); the logits are never recomputed."""
    if recompute == "full":
        return global_batch * model.layers * (model.attn_flops(1) + model.mlp_flops(1))
    if recompute == "selective":
        return global_batch * model.layers * model.attn_core_flops(1)
    return 0.0


def megatron_step_flops(model: ModelSpec, global_batch: int, full_recompute: bool) -> float:
    """The Megatron-LM paper's closed form (Narayanan et al., 2021, eq. 3), f = 4h."""
    B, s, n, h, V = global_batch, model.seq_len, model.layers, model.hidden, model.vocab
    if full_recompute:
        return 96 * B * s * n * h * h * (1 + s / (6 * h) + V / (16 * n * h))
    return 72 * B * s * n * h * h * (1 + s / (6 * h) + V / (12 * n * h))
