"""Attention on one tensor-parallel shard: the q/k/v layout, grouped-query heads, rotary
positions and the causal core, as torch functions the kernels of `executor.kernels` call.

qkv is [s, b, (a + 2g)/t · d]: this rank's a/t query heads, then its g/t key heads, then its
g/t value heads (`executor.params.tp_shard` cuts the full weight so). Query head i attends with
key/value head i // (a/g) (Megatron-Core's query groups); a TP rank holds whole groups, since t
divides g. `core_attention` takes q, k, v as [b, heads, s, d] and returns [b, a/t, s, d], so a
context-parallel wrapper can call it on its chunks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ROPE_BASE = 10000.0
"""Rotary frequencies' base θ (RoFormer, Su et al. 2021; Llama 2's; Llama 3 uses 500000)."""


def split_qkv(qkv: torch.Tensor, heads: int, kv_heads: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [b, heads, s, d], k and v [b, kv_heads, s, d] of this rank's [s, b, ...] qkv."""
    s, b, width = qkv.shape
    d = width // (heads + 2 * kv_heads)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    return tuple(t.reshape(s, b, -1, d).permute(1, 2, 0, 3)  # type: ignore[return-value]
                 for t in (q, k, v))


def split_mla_qkv(qkv: torch.Tensor, heads: int, qk_dim: int, v_dim: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Latent attention's [s, b, heads·(2·qk_dim + v_dim)] slot (`executor.kernels._mla_rope`
    writes it) as q, k [b, heads, s, qk_dim] and v [b, heads, s, v_dim]."""
    s, b, _ = qkv.shape
    q, k, v = qkv.split([heads * qk_dim, heads * qk_dim, heads * v_dim], dim=-1)
    return tuple(t.reshape(s, b, heads, -1).permute(1, 2, 0, 3)  # type: ignore[return-value]
                 for t in (q, k, v))


def norm_heads(qkv: torch.Tensor, heads: int, kv_heads: int, params: tuple[torch.Tensor, ...],
               rmsnorm: bool, eps: float) -> torch.Tensor:
    """The [s, b, ...] qkv with each query and key head normalized over its d channels (qk_norm,
    `traces.heads`): `params` the query heads' weight (and bias, LayerNorm), then the key
    heads'; v as it is."""
    s, b, width = qkv.shape
    d = width // (heads + 2 * kv_heads)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    half = len(params) // 2

    def norm(x: torch.Tensor, n: int, w: torch.Tensor, *bias: torch.Tensor) -> torch.Tensor:
        x = x.reshape(s, b, n, d)
        if rmsnorm:  # x / sqrt(mean(x²) + ε) · w, as the other RMSNorms
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
        else:
            y = F.layer_norm(x, (d,), w, bias[0], eps)
        return y.reshape(s, b, n * d)

    return torch.cat([norm(q, heads, *params[:half]), norm(k, kv_heads, *params[half:]), v],
                     dim=-1)


def merge_heads(ctx_heads: torch.Tensor) -> torch.Tensor:
    """[b, heads, s, d] -> [s, b, heads*d]."""
    b, n, s, d = ctx_heads.shape
    return ctx_heads.permute(2, 0, 1, 3).reshape(s, b, n * d)


def expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """k or v of g heads repeated to the `heads` query heads they serve (i // (heads/g))."""
    group = heads // t.shape[1]
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def causal_mask(s: int, device: torch.device) -> torch.Tensor:
    """True above the diagonal: the future positions a query may not see."""
    return torch.ones(s, s, dtype=torch.bool, device=device).triu(1)


def core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout: float = 0.0,
                   seed: int | None = None) -> torch.Tensor:
    """Causal softmax(qkᵀ/√d)·v over [b, heads, s, d] q and [b, g, s, d] k, v (one fused call);
    `seed` seeds the attention dropout (sdpa draws from the global generator)."""
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    if dropout == 0.0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert seed is not None, "attention dropout needs its seed"
    with torch.random.fork_rng(devices=[q.device] if q.is_cuda else []):
        torch.manual_seed(seed)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)


def rope_tables(positions: torch.Tensor, d: int, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [s, d] of the angles p·θ^(-2i/d) at `positions` (the tokens' indices in
    the sequence: a context-parallel chunk passes its own), each frequency over both halves of
    the head (GPT-NeoX's rotate-half layout, Megatron-Core's default)."""
    device = positions.device
    inv = ROPE_BASE ** (-torch.arange(0, d, 2, dtype=torch.float32, device=device) / d)
    angles = positions.to(torch.float32)[:, None] * inv[None, :]
    both = torch.cat([angles, angles], dim=-1)
    return both.cos().to(dtype), both.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [s, b, heads, d] rotated: x·cos + rotate_half(x)·sin, rotate_half(x) = (-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos[:, None, None, :] + rotated * sin[:, None, None, :]


def rope_qkv(qkv: torch.Tensor, heads: int, kv_heads: int,
             positions: torch.Tensor | None = None) -> torch.Tensor:
    """The [s, b, ...] qkv with its q and k heads rotated by position (v unchanged);
    `positions` default to 0 .. s-1."""
    s, b, width = qkv.shape
    d = width // (heads + 2 * kv_heads)
    if positions is None:
        positions = torch.arange(s, device=qkv.device)
    cos, sin = rope_tables(positions, d, qkv.dtype)
    qk, v = qkv.split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
    rotated = apply_rope(qk.reshape(s, b, heads + kv_heads, d), cos, sin)
    return torch.cat([rotated.reshape(s, b, -1), v], dim=-1)


def scale(d: int) -> float:
    return 1.0 / math.sqrt(d)
