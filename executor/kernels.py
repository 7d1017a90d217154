"""The named kernels of docs/plan-ops.md as torch functions on one tensor-parallel shard.

Each kernel reads named *slots* of a micro-batch's activations and writes others, so that the
executor can run it alone — forward, recompute or backward — with the tensor-parallel
collectives between kernels as explicit calls (`executor.tape`). Tensors are sequence-first,
[s, b, h] (with sequence parallelism the norms, dropouts and residuals hold s/t of the
sequence), as in Megatron-LM, so a sequence shard is a contiguous block.

Slots (scope, name): scope is a layer index, "E" (embedding), "H" (head) or "D" (data). Layer i
reads (i, "x") and writes (i + 1, "x"), so a stage's output and the next stage's input, and
their gradients, share one key.

    ln1 x->a1  qkv a1->qkv  flash_attn qkv->ctx | qk qkv->scores  softmax ->probs
    attn_dropout ->probs_d  av (probs_d, qkv)->ctx  proj ctx->attn  bda1 (attn, x)->y
    ln2 y->a2  fc1 a2->h1  gelu ->h2  fc2 ->mlp  bda2 (mlp, y)->x+
    embed tokens->emb  pos_embed emb->x0  final_ln xL->fln  logits fln->(logits, lmax)
    cross_entropy (logits, lmax, targets)->stats
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from traces.purpose import STEP_KERNELS, Kernel

LN_EPS = 1e-5
Slot = tuple[int | str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelContext:
    """What a kernel needs besides its tensors: sizes, this rank's shard, dropout seeds."""

    heads: int
    """Attention heads on this TP rank (a/t)."""
    head_dim: int
    tp: int
    tp_rank: int
    sp: bool
    vocab_shard: int
    """Rows of the vocabulary on this rank (V/t); this rank's rows start at tp_rank * it."""
    dropout: float = 0.0
    seed: int = 0
    layer: int = -1
    microbatch: int = 0
    step: int = 0


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

def _ln(ctx: KernelContext, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor
        ) -> tuple[torch.Tensor]:
    return (F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS),)


def _linear(ctx: KernelContext, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
            ) -> tuple[torch.Tensor]:
    return (F.linear(x, w, b),)


def _heads(qkv: torch.Tensor, heads: int, which: int) -> torch.Tensor:
    """q (0), k (1) or v (2) of the [s, b, 3*heads*d] QKV output as [b, heads, s, d]."""
    s, b, width = qkv.shape
    return qkv.view(s, b, 3, heads, width // (3 * heads))[:, :, which].permute(1, 2, 0, 3)


def _merge(ctx_heads: torch.Tensor) -> torch.Tensor:
    """[b, heads, s, d] -> [s, b, heads*d]."""
    b, n, s, d = ctx_heads.shape
    return ctx_heads.permute(2, 0, 1, 3).reshape(s, b, n * d)


def _flash_attn(ctx: KernelContext, qkv: torch.Tensor) -> tuple[torch.Tensor]:
    q, k, v = (_heads(qkv, ctx.heads, i) for i in range(3))
    if ctx.dropout == 0.0:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:  # sdpa draws from the global generator: fork it and seed it for this site
        devices = [qkv.device] if qkv.is_cuda else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(_seed(ctx, "flash_attn", True))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=ctx.dropout)
    return (_merge(out),)


def _qk(ctx: KernelContext, qkv: torch.Tensor) -> tuple[torch.Tensor]:
    q, k = _heads(qkv, ctx.heads, 0), _heads(qkv, ctx.heads, 1)
    return (q @ k.transpose(-2, -1),)


def _softmax(ctx: KernelContext, scores: torch.Tensor) -> tuple[torch.Tensor]:
    s = scores.shape[-1]
    mask = torch.ones(s, s, dtype=torch.bool, device=scores.device).triu(1)
    scaled = scores * (1.0 / math.sqrt(ctx.head_dim))
    return (torch.softmax(scaled.masked_fill(mask, float("-inf")), dim=-1),)


def _attn_dropout(ctx: KernelContext, probs: torch.Tensor) -> tuple[torch.Tensor]:
    return (dropout(probs, ctx.dropout, _seed(ctx, "attn_dropout", True)),)


def _av(ctx: KernelContext, probs: torch.Tensor, qkv: torch.Tensor) -> tuple[torch.Tensor]:
    return (_merge(probs @ _heads(qkv, ctx.heads, 2)),)


def _bda(site: str) -> Callable[..., tuple[torch.Tensor]]:
    def bda(ctx: KernelContext, x: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor
            ) -> tuple[torch.Tensor]:
        return (residual + dropout(x + bias, ctx.dropout, _seed(ctx, site, ctx.sp)),)
    return bda


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


def _pos_embed(ctx: KernelContext, emb: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor]:
    s = emb.shape[0]
    rows = pos[ctx.tp_rank * s:(ctx.tp_rank + 1) * s] if ctx.sp else pos[:s]
    return (dropout(emb + rows.unsqueeze(1), ctx.dropout, _seed(ctx, "pos_embed", ctx.sp)),)


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


KERNELS: dict[Kernel, TorchKernel] = {k.name: k for k in (
    _k("ln1", "x", "a1", "ln1.weight ln1.bias", _ln),
    _k("qkv", "a1", "qkv", "qkv.weight qkv.bias", _linear),
    _k("flash_attn", "qkv", "ctx", "", _flash_attn),
    _k("qk", "qkv", "scores", "", _qk),
    _k("softmax", "scores", "probs", "", _softmax),
    _k("attn_dropout", "probs", "probs_d", "", _attn_dropout),
    _k("av", "probs_d qkv", "ctx", "", _av),
    _k("proj", "ctx", "attn", "proj.weight", _linear),
    _k("bda1", "attn x", "y", "proj.bias", _bda("bda1")),
    _k("ln2", "y", "a2", "ln2.weight ln2.bias", _ln),
    _k("fc1", "a2", "h1", "fc1.weight fc1.bias", _linear),
    _k("gelu", "h1", "h2", "", _gelu),
    _k("fc2", "h2", "mlp", "fc2.weight", _linear),
    _k("bda2", "mlp y", "x+", "fc2.bias", _bda("bda2")),
    _k("embed", "tokens", "emb", "word", _embed, "E"),
    _k("pos_embed", "emb", "x0", "pos", _pos_embed, "E"),
    _k("final_ln", "xL", "fln", "final_ln.weight final_ln.bias", _ln, "H"),
    _k("logits", "fln", "logits lmax", "output", _logits, "H"),
    _k("cross_entropy", "logits lmax targets", "stats", "", _cross_entropy, "H"),
)}

assert set(KERNELS) == set(Kernel) - set(STEP_KERNELS), "a torch function per plan kernel"


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
