"""The named kernels of docs/plan-ops.md as torch functions on one tensor-parallel shard.

Each kernel reads named *slots* of a micro-batch's activations and writes others, so that the
executor can run it alone — forward, recompute or backward — with the tensor-parallel
collectives between kernels as explicit calls (`executor.tape`). Tensors are sequence-first,
[s, b, h] (with sequence parallelism the norms, dropouts and residuals hold s/t of the
sequence), as in Megatron-LM, so a sequence shard is a contiguous block.

Slots (scope, name): scope is a layer index, "E" (embedding), "H" (head) or "D" (data). Layer i
reads (i, "x") and writes (i + 1, "x"), so a stage's output and the next stage's input, and
their gradients, share one key.

    ln1 x->a1  qkv a1->qkv (a1->qkv_raw  rope qkv_raw->qkv with rotary positions; with
    qk_norm a1->qkv_n  qk_norm qkv_n->qkv_raw, or ->qkv without rope)
    latent attention instead: mla_down a1->lat  latent_norm lat->latn  q_up latn (or a1)->q_raw
    kv_up latn->kv  rope (q_raw, kv, latn)->qkv, qkv = [q | k | v] of a/t heads each
    flash_attn qkv->ctx | qk qkv->scores  softmax ->probs
    attn_dropout ->probs_d  av (probs_d, qkv)->ctx  proj ctx->attn  bda1 (attn, x)->y
    ln2 y->a2  fc1 a2->h1  gelu|swiglu ->h2  fc2 ->mlp  bda2 (mlp, y)->x+

The table depends on the model (`kernel_table`): without biases the linears and the bdas take
none, RMSNorm has no bias, rotary positions no position table; `KERNELS` is GPT's.
    embed tokens->emb  pos_embed emb->x0  final_ln xL->fln  logits fln->(logits, lmax)
    cross_entropy (logits, lmax, targets)->stats
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

from executor.attention import (
    apply_rope,
    causal_mask,
    core_attention,
    expand_kv,
    merge_heads,
    norm_heads,
    rope_qkv,
    rope_tables,
    scale,
    split_mla_qkv,
    split_qkv,
)
from traces.kernel_groups import FP8_KERNELS, GRAD_STORE_KERNELS, MOE, MTP_KERNELS, STEP_KERNELS
from traces.model import ModelSpec
from traces.purpose import Kernel

LN_EPS = 1e-5
Slot = tuple[int | str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelContext:
    """What a kernel needs besides its tensors: sizes, this rank's shard, dropout seeds."""

    heads: int
    """Attention heads on this TP rank (a/t)."""
    head_dim: int
    kv_heads: int = 0
    """Key/value heads on this TP rank (g/t); 0: as many as `heads`."""
    rmsnorm: bool = False
    tp: int
    tp_rank: int
    sp: bool
    vocab_shard: int
    """Rows of the vocabulary on this rank (V/t); this rank's rows start at tp_rank * it."""
    dropout: float = 0.0
    cp: int = 1
    """Context parallelism: the rank holds chunks cp_rank and 2·cp − 1 − cp_rank of the
    sequence (`local_positions`)."""
    cp_rank: int = 0
    seed: int = 0
    layer: int = -1
    microbatch: int = 0
    step: int = 0
    q_lora: int = 0
    """Latent attention (`traces.mla`): q_lora_rank, kv_lora_rank, the rotary and value head
    widths; `v_dim` 0 without it. `head_dim` is then a query/key head's d + r."""
    kv_lora: int = 0
    rope_dim: int = 0
    v_dim: int = 0


def mla_fields(model: ModelSpec) -> dict[str, int]:
    """The context's head widths for `model`: d (d + r with latent attention) and MLA's."""
    if not model.mla:
        return {"head_dim": model.head_dim}
    return {"head_dim": model.head_dim + model.qk_rope_head_dim, "q_lora": model.q_lora_rank,
            "kv_lora": model.kv_lora_rank, "rope_dim": model.qk_rope_head_dim,
            "v_dim": model.v_head_dim}


@dataclass(frozen=True, slots=True)
class TorchKernel:
    name: Kernel
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[str, ...]
    fn: Callable[..., tuple[torch.Tensor, ...]]
    scope: str
    """'layer', 'E' or 'H': where its slots and parameters live."""


# --- dropout with fixed seeds, so that recomputation draws the same masks ----------------------

_SITES = {"attn_dropout": 1, "flash_attn": 2, "bda1": 3, "bda2": 4, "pos_embed": 5}


def _seed(ctx: KernelContext, site: str, sharded: bool) -> int:
    """A seed per (step, layer, micro-batch, site), and per TP rank for tensors that differ
    between TP ranks (attention heads; with SP, sequence shards)."""
    rank = ctx.tp_rank if sharded else 0
    key = (((ctx.seed * 1009 + ctx.step) * 4099 + ctx.layer + 1) * 65537 + ctx.microbatch)
    return (key * 31 + _SITES[site]) * 257 + rank


def dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    if p == 0.0:
        return x
    gen = torch.Generator(device=x.device).manual_seed(seed)
    keep = torch.rand(x.shape, generator=gen, device=x.device) >= p
    return x * keep / (1.0 - p)


# --- layer kernels -----------------------------------------------------------------------------

def _ln(ctx: KernelContext, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
        ) -> tuple[torch.Tensor]:
    if ctx.rmsnorm:  # x / sqrt(mean(x²) + ε) · w
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + LN_EPS) * w,)
    return (F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS),)


def _linear(ctx: KernelContext, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
            ) -> tuple[torch.Tensor]:
    return (F.linear(x, w, b),)


def _qkv(ctx: KernelContext, qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if ctx.v_dim:
        return split_mla_qkv(qkv, ctx.heads, ctx.head_dim, ctx.v_dim)
    return split_qkv(qkv, ctx.heads, ctx.kv_heads or ctx.heads)


# --- latent attention (traces.mla) -------------------------------------------------------------

def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + LN_EPS) * w


def _latent_norm(ctx: KernelContext, lat: torch.Tensor, *weights: torch.Tensor
                 ) -> tuple[torch.Tensor]:
    """[c_q | c_kv | k_pe] with c_q and c_kv RMS-normalized (k_pe as it is)."""
    qr, kr = ctx.q_lora, ctx.kv_lora
    c_q, c_kv, k_pe = lat.split([qr, kr, ctx.rope_dim], dim=-1)
    parts = [_rms(c_q, weights[0])] if qr else []
    return (torch.cat([*parts, _rms(c_kv, weights[-1]), k_pe], dim=-1),)


def _q_up(ctx: KernelContext, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
    """This rank's a/t query heads of d + r, from c_q (or from ln1's output itself)."""
    return (F.linear(x[..., :ctx.q_lora] if ctx.q_lora else x, w),)


def _kv_up(ctx: KernelContext, latn: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
    """This rank's a/t heads of [k_nope (d) | v (d_v)], from c_kv."""
    return (F.linear(latn[..., ctx.q_lora:ctx.q_lora + ctx.kv_lora], w),)


def _mla_rope(ctx: KernelContext, q_raw: torch.Tensor, kv: torch.Tensor, latn: torch.Tensor
              ) -> tuple[torch.Tensor]:
    """q's rotary dims and the shared k_pe rotated, k = [k_nope | k_pe] per head, written as
    one [s, b, heads·(2(d + r) + d_v)] slot for the core."""
    s, b, _ = q_raw.shape
    r, dq, dv, n = ctx.rope_dim, ctx.head_dim, ctx.v_dim, ctx.heads
    cos, sin = rope_tables(torch.arange(s, device=q_raw.device), r, q_raw.dtype)
    q_nope, q_pe = q_raw.reshape(s, b, n, dq).split([dq - r, r], dim=-1)
    k_nope, v = kv.reshape(s, b, n, dq - r + dv).split([dq - r, dv], dim=-1)
    k_pe = apply_rope(latn[..., -r:].reshape(s, b, 1, r), cos, sin).expand(s, b, n, r)
    q = torch.cat([q_nope, apply_rope(q_pe, cos, sin)], dim=-1)
    k = torch.cat([k_nope, k_pe], dim=-1)
    return (torch.cat([t.reshape(s, b, -1) for t in (q, k, v)], dim=-1),)


def _qk_norm(ctx: KernelContext, qkv: torch.Tensor, *w: torch.Tensor) -> tuple[torch.Tensor]:
    return (norm_heads(qkv, ctx.heads, ctx.kv_heads or ctx.heads, w, ctx.rmsnorm, LN_EPS),)


def _rope(ctx: KernelContext, qkv: torch.Tensor) -> tuple[torch.Tensor]:
    """Rotary positions at the tokens' global positions (under CP, the rank's two chunks)."""
    positions = local_positions(qkv.shape[0] * ctx.cp, ctx.cp, ctx.cp_rank) \
        if ctx.cp > 1 else None
    return (rope_qkv(qkv, ctx.heads, ctx.kv_heads or ctx.heads, positions),)


def _flash_attn(ctx: KernelContext, qkv: torch.Tensor) -> tuple[torch.Tensor]:
    q, k, v = _qkv(ctx, qkv)
    seed = _seed(ctx, "flash_attn", True) if ctx.dropout else None
    return (merge_heads(core_attention(q, k, v, dropout=ctx.dropout, seed=seed)),)


def _qk(ctx: KernelContext, qkv: torch.Tensor) -> tuple[torch.Tensor]:
    q, k, _ = _qkv(ctx, qkv)
    return (q @ expand_kv(k, ctx.heads).transpose(-2, -1),)


def _softmax(ctx: KernelContext, scores: torch.Tensor) -> tuple[torch.Tensor]:
    mask = causal_mask(scores.shape[-1], scores.device)
    scaled = scores * scale(ctx.head_dim)
    return (torch.softmax(scaled.masked_fill(mask, float("-inf")), dim=-1),)


def _attn_dropout(ctx: KernelContext, probs: torch.Tensor) -> tuple[torch.Tensor]:
    return (dropout(probs, ctx.dropout, _seed(ctx, "attn_dropout", True)),)


def _av(ctx: KernelContext, probs: torch.Tensor, qkv: torch.Tensor) -> tuple[torch.Tensor]:
    _, _, v = _qkv(ctx, qkv)
    return (merge_heads(probs @ expand_kv(v, ctx.heads)),)


def _bda(site: str) -> Callable[..., tuple[torch.Tensor]]:
    def bda(ctx: KernelContext, x: torch.Tensor, residual: torch.Tensor,
            bias: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        x = x if bias is None else x + bias
        return (residual + dropout(x, ctx.dropout, _seed(ctx, site, ctx.sp)),)
    return bda


def _swiglu(ctx: KernelContext, x: torch.Tensor) -> tuple[torch.Tensor]:
    """silu(gate)·up of fc1's [gate | up] output (this rank's f/t of each)."""
    gate, up = x.chunk(2, dim=-1)
    return (F.silu(gate) * up,)


def _gelu(ctx: KernelContext, x: torch.Tensor) -> tuple[torch.Tensor]:
    return (F.gelu(x),)


# --- embedding and head kernels -------------------------------------------------------------

def _vocab_local(ctx: KernelContext, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids relative to this rank's vocabulary rows, clamped, and where they fall in it."""
    local = ids - ctx.tp_rank * ctx.vocab_shard
    inside = (local >= 0) & (local < ctx.vocab_shard)
    return local.clamp(0, ctx.vocab_shard - 1), inside


def _embed(ctx: KernelContext, tokens: torch.Tensor, word: torch.Tensor) -> tuple[torch.Tensor]:
    """Vocab-parallel lookup: rows this rank does not hold give zeros (partial sums)."""
    if ctx.tp == 1:
        return (F.embedding(tokens, word),)
    local, inside = _vocab_local(ctx, tokens)
    return (F.embedding(local, word) * inside.unsqueeze(-1).to(word.dtype),)


def local_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """Global positions of CP rank `cp_rank`'s tokens: chunks cp_rank and 2·cp − 1 − cp_rank
    of the 2·cp chunks of a `seq_len` sequence, in that order (Megatron-Core's
    get_batch_on_this_cp_rank)."""
    c = seq_len // (2 * cp)
    first = torch.arange(cp_rank * c, (cp_rank + 1) * c)
    second = torch.arange((2 * cp - 1 - cp_rank) * c, (2 * cp - cp_rank) * c)
    return torch.cat([first, second])


def token_positions(ctx: KernelContext, s: int) -> torch.Tensor:
    """Global positions of the `s` tokens this rank's tensor holds (with SP, its shard of
    the CP rank's tokens); rotary embeddings take the same positions."""
    local = s * ctx.tp if ctx.sp else s
    positions = local_positions(local * ctx.cp, ctx.cp, ctx.cp_rank)
    return positions[ctx.tp_rank * s:(ctx.tp_rank + 1) * s] if ctx.sp else positions


def _pos_embed(ctx: KernelContext, emb: torch.Tensor, pos: torch.Tensor | None = None
               ) -> tuple[torch.Tensor]:
    """The learned positions added (none with rotary positions), then dropout."""
    if pos is not None:
        s = emb.shape[0]
        if ctx.cp > 1:
            rows = pos[token_positions(ctx, s).to(pos.device)]
        else:
            rows = pos[ctx.tp_rank * s:(ctx.tp_rank + 1) * s] if ctx.sp else pos[:s]
        emb = emb + rows.unsqueeze(1)
    return (dropout(emb, ctx.dropout, _seed(ctx, "pos_embed", ctx.sp)),)


def _logits(ctx: KernelContext, x: torch.Tensor, w: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """[s, b, V/t] logits and their fp32 maximum over this rank's columns (no gradient: the
    loss does not depend on the shift, only its numerical safety does)."""
    logits = F.linear(x, w)
    return logits, logits.detach().float().amax(dim=-1)


def _cross_entropy(ctx: KernelContext, logits: torch.Tensor, gmax: torch.Tensor,
                   targets: torch.Tensor) -> tuple[torch.Tensor]:
    """[2, s, b] fp32: the target's logit minus the max (0 where another rank holds the
    target), and this rank's sum of exp(logit - max). Summed over the TP group they give the
    loss: log(sum) - target."""
    z = logits.float() - gmax.unsqueeze(-1)
    sumexp = z.exp().sum(dim=-1)
    if ctx.tp == 1:
        target = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    else:
        local, inside = _vocab_local(ctx, targets)
        target = z.gather(-1, local.unsqueeze(-1)).squeeze(-1) * inside
    return (torch.stack([target, sumexp]),)


def ce_loss(stats: torch.Tensor) -> torch.Tensor:
    """Per-token loss [s, b] from the TP-summed cross-entropy statistics."""
    return stats[1].log() - stats[0]


# --- the table ------------------------------------------------------------------------------

def _k(name: str, inputs: str, outputs: str, params: str, fn: Callable[..., tuple[torch.Tensor,
       ...]], scope: str = "layer") -> TorchKernel:
    return TorchKernel(Kernel(name), tuple(inputs.split()), tuple(outputs.split()),
                       tuple(params.split()), fn, scope)


@cache
def kernel_table(*, bias: bool = True, rmsnorm: bool = False, rope: bool = False,
                 mla: bool = False, q_lora: bool = False, dropout: bool = True,
                 qk_norm: bool = False) -> dict[Kernel, TorchKernel]:
    """The torch kernels of a model with these options (`table_of` reads them off a model);
    `mla`: latent attention's rope, `q_lora`: its query compressed (q_up reads c_q);
    without `dropout` the plan runs no attn_dropout, so softmax writes what av reads."""
    b = "bias" if bias else ""
    norm_bias = "" if rmsnorm else "bias"

    def p(*names: str) -> str:
        return " ".join(n for n in names if not n.endswith("."))

    return {k.name: k for k in (
        _k("ln1", "x", "a1", p("ln1.weight", f"ln1.{norm_bias}"), _ln),
        _k("qkv", "a1", "qkv_n" if qk_norm else "qkv_raw" if rope else "qkv",
           p("qkv.weight", f"qkv.{b}"), _linear),
        _k("qk_norm", "qkv_n", "qkv_raw" if rope else "qkv", p(*(
            f"{x}_layernorm.{w}" for x in "qk" for w in ("weight", norm_bias))), _qk_norm),
        _k("rope", "qkv_raw", "qkv", "", _rope) if not mla else
        _k("rope", "q_raw kv latn", "qkv", "", _mla_rope),
        _k("mla_down", "a1", "lat", "mla_down.weight", _linear),
        _k("latent_norm", "lat", "latn", p("q_norm.weight" if q_lora else ".",
                                            "kv_norm.weight"), _latent_norm),
        _k("q_up", "latn" if q_lora else "a1", "q_raw", "q_up.weight", _q_up),
        _k("kv_up", "latn", "kv", "kv_up.weight", _kv_up),
        _k("flash_attn", "qkv", "ctx", "", _flash_attn),
        _k("qk", "qkv", "scores", "", _qk),
        _k("softmax", "scores", "probs" if dropout else "probs_d", "", _softmax),
        _k("attn_dropout", "probs", "probs_d", "", _attn_dropout),
        _k("av", "probs_d qkv", "ctx", "", _av),
        _k("proj", "ctx", "attn", "proj.weight", _linear),
        _k("bda1", "attn x", "y", p(f"proj.{b}"), _bda("bda1")),
        _k("ln2", "y", "a2", p("ln2.weight", f"ln2.{norm_bias}"), _ln),
        _k("fc1", "a2", "h1", p("fc1.weight", f"fc1.{b}"), _linear),
        _k("gelu", "h1", "h2", "", _gelu),
        _k("swiglu", "h1", "h2", "", _swiglu),
        _k("fc2", "h2", "mlp", "fc2.weight", _linear),
        _k("bda2", "mlp y", "x+", p(f"fc2.{b}"), _bda("bda2")),
        _k("embed", "tokens", "emb", "word", _embed, "E"),
        _k("pos_embed", "emb", "x0", "" if rope else "pos", _pos_embed, "E"),
        _k("final_ln", "xL", "fln", p("final_ln.weight", f"final_ln.{norm_bias}"), _ln, "H"),
        _k("logits", "fln", "logits lmax", "output", _logits, "H"),
        _k("cross_entropy", "logits lmax targets", "stats", "", _cross_entropy, "H"),
    )}


def table_of(model: ModelSpec) -> dict[Kernel, TorchKernel]:
    return kernel_table(bias=model.bias, rmsnorm=model.norm == "rmsnorm",
                        rope=model.position == "rope", mla=model.mla, qk_norm=model.qk_norm,
                        q_lora=model.q_lora_rank > 0, dropout=model.dropout > 0)


KERNELS = kernel_table()
"""GPT's kernels (biases, LayerNorm, learned positions)."""

assert set(KERNELS) == set(Kernel) - set(STEP_KERNELS) - FP8_KERNELS - set(MOE) - MTP_KERNELS \
    - GRAD_STORE_KERNELS, "a torch function per plan kernel (not FP8's, MoE's, MTP's, the store's)"


def slot(kernel: TorchKernel, name: str, layer: int | None, num_layers: int) -> Slot:
    """The tape key of one of `kernel`'s input or output names."""
    if name in ("tokens", "targets"):
        return ("D", name)
    if kernel.scope == "layer":
        assert layer is not None, f"{kernel.name} needs a layer"
        return (layer + 1, "x") if name == "x+" else (layer, name)
    if name == "x0":
        return (0, "x")
    if name == "xL":
        return (num_layers, "x")
    return (kernel.scope, name)
