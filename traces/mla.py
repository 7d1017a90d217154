"""Multi-head latent attention (DeepSeek-V2/V3): its `[model]` rules and its arithmetic.

Notation: h hidden, a heads, d = `head_dim` (DeepSeek's qk_nope_head_dim), r =
`qk_rope_head_dim`, d_v = `v_head_dim`, q_r = `q_lora_rank` (0: no query compression, as
DeepSeek-V2-Lite), k_r = `kv_lora_rank`, t tensor-parallel degree. A query/key head is d + r
wide, a value head d_v. The block, as Megatron-Core's MLASelfAttention runs it in training
(megatron/core/transformer/multi_latent_attention.py):

    down       x (h) -> [c_q (q_r) | c_kv (k_r) | k_pe (r)]    one fused GEMM, replicated on
                                                              every TP rank ("duplicated")
    norms      RMSNorm of c_q and of c_kv                      replicated
    q_up       c_q (or x when q_r = 0) -> a(d + r)              column-parallel: a/t heads
    kv_up      c_kv -> a(d + d_v): k_nope and v per head        column-parallel
    rope       the rope dims of q and the shared k_pe rotated; k = [k_nope | k_pe] per head
    core       softmax(q kᵀ/√(d + r)) v over a/t heads: full-size q, k, v (K and V are
               up-projected per head before the core, so only c_kv and c_q are small)
    proj       a·d_v -> h                                      row-parallel

Per layer, the weights: h(q_r + k_r + r) + q_r + k_r (down and the two norms, replicated) and
(q_r·a(d + r) or h·a(d + r)) + k_r·a(d + d_v) + a·d_v·h (split by t). DeepSeek-V3 (h 7168,
a 128, q_r 1536, k_r 512, d 128, r 64, d_v 128): 187,107,328 attention parameters a layer.

Forward FLOPs per token: 2h(q_r + k_r + r) + 2q_r·a(d + r) (2h·a(d + r) when q_r = 0) +
2k_r·a(d + d_v) + 2a·d_v·h, and 2s·a(d + r) + 2s·a·d_v in the core (full s², as Megatron-LM
counts it; the flash kernel executes half, `traces.kernels.FLASH_CAUSAL`). MLA requires rotary
positions, no GQA (kv_heads = heads), RMSNorm and no biases (DeepSeek's; Megatron-Core builds
the MLA projections without biases). In FP8 (DeepSeek-V3 trained MLA's GEMMs in FP8)
mla_down, q_up, kv_up and proj are FP8 GEMMs with their recipe's casts, the core stays bf16
(`traces.fp8`); parameters and FLOPs are the same.
"""

from __future__ import annotations

from typing import Protocol

from traces.errors import ConfigError, show


class ModelSpec(Protocol):
    """What this module reads of `traces.model.ModelSpec` (which imports this module)."""

    @property
    def hidden(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def q_lora_rank(self) -> int: ...
    @property
    def kv_lora_rank(self) -> int: ...
    @property
    def qk_rope_head_dim(self) -> int: ...
    @property
    def v_head_dim(self) -> int: ...
    @property
    def position(self) -> str: ...
    @property
    def norm(self) -> str: ...
    @property
    def bias(self) -> bool: ...
    @property
    def mla(self) -> bool: ...

MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim")
MAX_RANK = 2**16
"""Bound on the ranks and head widths (DeepSeek-V3: q_lora_rank 1536, kv_lora_rank 512, heads
of 128 + 64): far beyond any published model, so every count stays finite."""


def check_mla(m: ModelSpec) -> None:
    """Validate the MLA keys and `head_dim`, and resolve `head_dim` (h/a) and `v_head_dim`
    (head_dim)."""
    for name in (*MLA_KEYS, "head_dim"):
        value = getattr(m, name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_RANK:
            raise ConfigError(f"model.{name}: {show(value)} must be an integer from 1 to "
                              f"{MAX_RANK:,} (or 0 for the default)")
    if not m.kv_lora_rank:
        for name in ("q_lora_rank", "qk_rope_head_dim", "v_head_dim"):
            if getattr(m, name):
                raise ConfigError(f"model.{name}: {getattr(m, name)} applies only to latent "
                                  "attention (set model.kv_lora_rank)")
        if m.head_dim == 0:  # any width of its own otherwise (`traces.heads`)
            object.__setattr__(m, "head_dim", m.hidden // m.heads)
        return
    _check_combination(m)
    if m.head_dim == 0:
        object.__setattr__(m, "head_dim", m.hidden // m.heads)
    if m.v_head_dim == 0:
        object.__setattr__(m, "v_head_dim", m.head_dim)


def _check_combination(m: ModelSpec) -> None:
    """The combinations latent attention cannot run with (module docstring)."""
    rules = (
        (m.qk_rope_head_dim == 0, "qk_rope_head_dim", m.qk_rope_head_dim,
         "latent attention needs a rotary part (DeepSeek-V3: 64)"),
        (m.qk_rope_head_dim % 2 == 1, "qk_rope_head_dim", m.qk_rope_head_dim,
         "must be even (rotary pairs)"),
        (m.position != "rope", "position", show(m.position),
         "latent attention needs position = \"rope\" (its decoupled rotary key)"),
        (m.kv_heads != m.heads, "kv_heads", m.kv_heads,
         f"latent attention has one key/value head per query head (heads = {m.heads})"),
        (m.norm != "rmsnorm", "norm", show(m.norm),
         "latent attention is modelled with RMSNorm (DeepSeek's)"),
        (m.bias, "bias", "true", "latent attention's projections have no biases (set false)"),
    )
    for broken, name, value, rule in rules:
        if broken:
            raise ConfigError(f"model.{name}: {value}: {rule}")


# --- widths ---------------------------------------------------------------------------------

def qk_dim(m: ModelSpec) -> int:
    """A query/key head's width: d + r (d alone without MLA)."""
    return m.head_dim + m.qk_rope_head_dim


def v_dim(m: ModelSpec) -> int:
    """A value head's width: d_v (d without MLA)."""
    return m.v_head_dim if m.mla else m.head_dim


def down_width(m: ModelSpec) -> int:
    """The fused down-projection's output: q_r + k_r + r."""
    return m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim


def q_in(m: ModelSpec) -> int:
    """q_up's input width: q_r, or h when the query is not compressed."""
    return m.q_lora_rank or m.hidden


# --- parameters and FLOPs -------------------------------------------------------------------

def mla_params(m: ModelSpec) -> tuple[int, int]:
    """(split by t, replicated) attention parameters of one layer, without ln1 (module
    docstring)."""
    a, h = m.heads, m.hidden
    split = q_in(m) * a * qk_dim(m) + m.kv_lora_rank * a * (m.head_dim + m.v_head_dim) + \
        a * m.v_head_dim * h
    replicated = h * down_width(m) + m.q_lora_rank + m.kv_lora_rank
    return split, replicated


def mla_flops(m: ModelSpec, b: int, tp: int) -> float:
    """Forward FLOPs of one layer's attention for b samples on one TP rank: the down
    projection runs in full on every rank, the rest is split by t."""
    s = m.seq_len
    split, _ = mla_params(m)
    down = 2 * b * s * m.hidden * down_width(m)
    return down + 2 * b * s * split / tp + mla_core_flops(m, b, tp)


def mla_core_flops(m: ModelSpec, b: int, tp: int) -> float:
    """QKᵀ 2bs²·a(d + r) and AV 2bs²·a·d_v, over t."""
    s = m.seq_len
    return 2 * b * s * s * m.heads * (qk_dim(m) + m.v_head_dim) / tp


def megatron_mla_term(m: ModelSpec) -> float:
    """Megatron-LM's num_floating_point_operations, MLA branch (megatron/training/training.py):
    the attention per layer and token, before its factor 3 (fwd + bwd) · 2 (FMA) — including
    the norms' +1 terms and the causal halving of the core, as it is there."""
    a, h, d, r, dv, s = (m.heads, m.hidden, m.head_dim, m.qk_rope_head_dim, m.v_head_dim,
                         m.seq_len)
    q_term = m.q_lora_rank * (h + a * (d + r) + 1) if m.q_lora_rank else h * a * (d + r)
    return (q_term + m.kv_lora_rank * (h + a * (d + dv) + 1) + h * r + a * dv * h
            + s * (a * (d + r)) / 2 + s * a * dv / 2)
