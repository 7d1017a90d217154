"""The kernels of one micro-batch on one GPU: FLOPs and HBM bytes, forward and backward.

A transformer layer runs, forward: ln1, qkv, the attention core (flash_attn, or qk, softmax,
attn_dropout, av), proj, bda1, ln2, fc1, gelu, fc2, bda2; outside the layers embed and pos_embed
on the first stage, final_ln, logits and cross_entropy on the last (docs/plan-ops.md has the
contract). FLOPs count matrix products only (2 per multiply-add), as Megatron-LM does: one
layer's forward is 24bsh²(1 + s/(6h))/t with f = 4h; a GEMM's backward is twice its FLOPs.
HBM bytes: a GEMM reads its operands and writes its product once; a memory-bound kernel reads
and writes each tensor once. The optimizer step (`optimizer_bytes_per_param`) is
Megatron-LM's mixed-precision one.

    python -c "from traces.kernels import *; from traces.model import ModelSpec as M;
    print(layer_kernels(M(layers=1, hidden=4096, heads=32, seq_len=2048, vocab=1), 1, 1, False))"

The derivation in full: docs/kernel-costs.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from traces.model import DTYPE_BYTES, ModelSpec
from traces.purpose import ATTENTION_CORE, Kernel

__all__ = ["ATTENTION_CORE", "FUSED_SOFTMAX_MAX_SEQ", "Gemm", "KernelWork", "attention_kernels",
           "cross_entropy_bytes", "embedding_kernels", "gemm_kernel", "head_kernels",
           "layer_kernels", "memory_kernel", "optimizer_bytes_per_param", "softmax_bytes",
           "step_kernel_bytes"]
K = Kernel

Gemm = tuple[int, int, int, int]
"""(batch, M, N, K): batch products of an M×K and a K×N matrix."""


@dataclass(frozen=True, slots=True)
class KernelWork:
    """One kernel's cost for one micro-batch: forward, and its own backward."""

    name: Kernel
    flops: float
    mem_bytes: float
    bwd_flops: float
    bwd_bytes: float
    gemm: Gemm | None = None


def gemm_kernel(name: Kernel, gemm: Gemm, e: int, grad_bytes: int, weights: bool = True
                ) -> KernelWork:
    """A GEMM and its backward. Forward reads A (M×K) and B (K×N), writes C (M×N). Backward
    computes dA = dC·Bᵀ (reads dC, B, writes dA) and dB = Aᵀ·dC (reads A, dC, writes dB); a
    weight gradient (`weights`) is accumulated in `grad_bytes` per element (read and written)."""
    batch, m, n, k = gemm
    flops = 2.0 * batch * m * n * k
    a, b, c = batch * m * k, batch * k * n, batch * m * n
    forward = (a + b + c) * e
    db = 2 * b * grad_bytes if weights else b * e
    backward = (c + b + a) * e + (a + c) * e + db
    return KernelWork(name, flops, forward, 2 * flops, backward, gemm)


def memory_kernel(name: Kernel, fwd_bytes: float, bwd_bytes: float) -> KernelWork:
    return KernelWork(name, 0.0, fwd_bytes, 0.0, bwd_bytes)


def layer_kernels(model: ModelSpec, b: int, t: int, sp: bool,
                  grad_bytes: int | None = None) -> list[KernelWork]:
    """One layer's kernels in forward order, for one micro-batch on one TP rank."""
    s, h, f, e = model.seq_len, model.hidden, model.ffn_hidden, model.dtype_bytes
    g = e if grad_bytes is None else grad_bytes
    r = s // t if sp else s  # tokens of the norms and dropouts on this rank
    return [
        _norm(K.LN1, b * r * h, e, residual=True),
        gemm_kernel(K.QKV, (1, b * s, 3 * h // t, h), e, g),
        *attention_kernels(model, b, t),
        gemm_kernel(K.PROJ, (1, b * s, h, h // t), e, g),
        _bda(K.BDA1, b * r * h, e),
        _norm(K.LN2, b * r * h, e, residual=True),
        gemm_kernel(K.FC1, (1, b * s, f // t, h), e, g),
        memory_kernel(K.GELU, 2 * b * s * f / t * e, 4 * b * s * f / t * e),
        gemm_kernel(K.FC2, (1, b * s, h, f // t), e, g),
        _bda(K.BDA2, b * r * h, e),
    ]


def attention_kernels(model: ModelSpec, b: int, t: int) -> list[KernelWork]:
    """The attention core: one flash kernel, or Megatron-LM's unfused four."""
    s, h, a, e = model.seq_len, model.hidden, model.heads, model.dtype_bytes
    heads = b * a // t
    d = h // a
    if model.attention == "flash":
        flops = 4.0 * heads * s * s * d  # QKᵀ and AV: 2·b·s²·h/t each
        qkvo = 4 * heads * s * d * e
        lse = heads * s * 4
        grads = 4 * heads * s * d * e  # dO read, dQ, dK, dV written
        return [KernelWork(K.FLASH_ATTN, flops, qkvo + lse, 2 * flops, qkvo + lse + grads)]
    scores = heads * s * s
    return [
        gemm_kernel(K.QK, (heads, s, s, d), e, e, weights=False),
        memory_kernel(K.SOFTMAX, *softmax_bytes(scores, s, heads, e)),
        memory_kernel(K.ATTN_DROPOUT, scores * (2 * e + 1), scores * (2 * e + 1)),
        gemm_kernel(K.AV, (heads, s, d, s), e, e, weights=False),
    ]


FUSED_SOFTMAX_MAX_SEQ = 2048
"""Longest sequence Megatron-LM's fused causal softmax takes (scaled_upper_triang_masked_softmax.h
asserts softmax_elements <= 2048 in the 2021-2022 releases; later ones raised it to 4096)."""


def softmax_bytes(scores: int, s: int, heads: int, e: int) -> tuple[float, float]:
    """HBM bytes (forward, backward) of the scale-mask-softmax over `scores` = heads·s² scores.

    Megatron-LM's FusedScaleMaskSoftmax runs its fused causal kernel when the input is 16-bit,
    16 < s <= FUSED_SOFTMAX_MAX_SEQ, s % 4 == 0 and the b·a/t score matrices come in fours
    (fused_softmax.py, is_kernel_available). That kernel loads only the first i + 1 scores of
    row i and writes all s (zeros past the diagonal): the unmasked fraction is c = (s+1)/(2s).

    Otherwise it falls back to PyTorch ops in fp32 (softmax_in_fp32, which query-key layer
    scaling forces), one pass each, per score:
        forward   to fp32 (e + 4), scale (4 + 4), masked_fill_ (4 + 4), softmax (4 + 4),
                  back to 16 bits (4 + e)                           = 28 + 2e
        backward  to fp32 (e + 4), softmax's (read y, dy, write: 12), masked_fill (8),
                  scale (8), back (4 + e)                           = 32 + 2e
    (an fp32 model skips the two casts)."""
    if e < 4 and 16 < s <= FUSED_SOFTMAX_MAX_SEQ and s % 4 == 0 and heads % 4 == 0:
        c = (s + 1) / (2 * s)
        return scores * e * (c + 1), scores * e * (2 * c + 1)
    casts = 2 * (e + 4) if e < 4 else 0
    return scores * (24 + casts), scores * (28 + casts)


def embedding_kernels(model: ModelSpec, b: int, t: int, sp: bool,
                      grad_bytes: int | None = None) -> list[KernelWork]:
    """First stage: the vocab-parallel lookup (rows read, partial sums written; backward
    scatter-adds into the gradient table) and the position add with dropout."""
    s, h, e = model.seq_len, model.hidden, model.dtype_bytes
    g = e if grad_bytes is None else grad_bytes
    r = s // t if sp else s
    return [
        memory_kernel(K.EMBED, 2 * b * s * h * e, b * s * h * (e + 2 * g)),
        memory_kernel(K.POS_EMBED, b * r * h * (2 * e + 1) + r * h * e,
                      b * r * h * (2 * e + 1) + 2 * r * h * g),
    ]


def head_kernels(model: ModelSpec, b: int, t: int, sp: bool,
                 grad_bytes: int | None = None) -> list[KernelWork]:
    """Last stage: the final norm, the vocab-parallel logits GEMM, the fp32 cross-entropy."""
    s, h, v, e = model.seq_len, model.hidden, model.vocab, model.dtype_bytes
    g = e if grad_bytes is None else grad_bytes
    r = s // t if sp else s
    logits = b * s * v // t
    return [
        _norm(K.FINAL_LN, b * r * h, e),
        gemm_kernel(K.LOGITS, (1, b * s, v // t, h), e, g),
        memory_kernel(K.CROSS_ENTROPY, *cross_entropy_bytes(logits, e)),
    ]


def step_kernel_bytes(dtype: str, grad_bytes: int) -> tuple[tuple[Kernel, float], ...]:
    """HBM bytes per parameter of each kernel at the end of the step, in order: Megatron-LM's
    mixed-precision step (megatron/optimizer/optimizer.py, `step` of its Float16 optimizer;
    clip_grads.py), Adam over fp32 main parameters of 16-bit model parameters (a 4-byte model
    has no copies):

        grad_unscale  fp16 only: unscale, check for inf/nan   read 4, write 4
        grad_norm     sum of squares for clipping (l2norm)    read 4
        grad_clip     scale by min(1, clip / norm)            read 4, write 4
        optimizer     16-bit gradients to fp32 main ones      read g, write 4  (none if g = 4)
                      Adam (multi_tensor_adam)                read p, g, m, v; write p, m, v: 28
                      fp32 main parameters to the model's     read 4, write e
                      zero the gradient buffer                write g

    (the main gradients' copy runs first in Megatron; it is counted with the optimizer's
    kernel, whose time is what matters). Megatron skips the clip's scale when the norm is
    below the threshold; torch's clip_grad_norm_ always multiplies by the clamped factor, and
    so does the plan. fp16 with 16-bit gradients: 8 + 4 + 8 + (6 + 28 + 6 + 2) = 62; bf16 with
    fp32 gradients (Megatron's rule for bf16): 4 + 8 + (28 + 6 + 4) = 50; fp32: 4 + 8 + 32."""
    e = DTYPE_BYTES[dtype]
    if e >= 4:  # an fp32 model: Adam, the norm and zeroing on the parameters themselves
        adam = 28 + grad_bytes
    else:
        to_main = 0 if grad_bytes >= 4 else grad_bytes + 4
        adam = to_main + 28 + (4 + e) + grad_bytes
    unscale = ((Kernel.GRAD_UNSCALE, 8.0),) if dtype == "fp16" else ()  # bf16: no loss scale
    return (*unscale, (Kernel.GRAD_NORM, 4.0), (Kernel.GRAD_CLIP, 8.0),
            (Kernel.OPTIMIZER, float(adam)))


def optimizer_bytes_per_param(dtype: str, grad_bytes: int) -> float:
    """HBM bytes per parameter of the whole end of the step (`step_kernel_bytes` summed)."""
    return sum(b for _, b in step_kernel_bytes(dtype, grad_bytes))


def cross_entropy_bytes(logits: int, e: int) -> tuple[float, float]:
    """HBM bytes (forward, backward) of the vocab-parallel cross-entropy over `logits` values
    (module docstring): fp32 passes over the logits, plus the casts of a 16-bit model."""
    cast = e + 4 if e < 4 else 0
    return logits * (32 + cast), logits * (8 + cast)


def _norm(name: Kernel, elements: int, e: int, residual: bool = False) -> KernelWork:
    """A layer norm; `residual`: its input is also the residual, whose two gradients
    autograd sums after the norm's backward (read both, write one)."""
    return memory_kernel(name, 2 * elements * e, (6 if residual else 3) * elements * e)


def _bda(name: Kernel, elements: int, e: int) -> KernelWork:
    """Bias-dropout-add; backward: dropout's backward, then the bias gradient's sum."""
    return memory_kernel(name, elements * (3 * e + 1), elements * (3 * e + 1))
