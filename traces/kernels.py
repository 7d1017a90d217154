"""The kernels of one micro-batch on one GPU: FLOPs and HBM bytes, forward and backward.

A transformer layer runs, forward: ln1, qkv (latent attention: mla_down, latent_norm, q_up,
kv_up), qk_norm (with `qk_norm`), rope (rotary positions only), the attention core
(flash_attn, or qk, softmax, attn_dropout, av), proj, bda1, ln2, fc1, gelu or swiglu, fc2, bda2;
outside the layers embed and pos_embed on the first stage, final_ln, logits and cross_entropy on
the last (docs/plan-ops.md has the contract). An fp8 model adds the casts of `traces.fp8`
around each linear layer's GEMM (its recipe's, `traces.fp8_recipes`). FLOPs count matrix
products only (2 per multiply-add), as Megatron-LM does: one layer's forward is
24bsh²(1 + s/(6h))/t with f = 4h; a GEMM's backward is twice its FLOPs.
HBM bytes: a GEMM reads its operands and writes its product once; a memory-bound kernel reads
and writes each tensor once. The optimizer step (`optimizer_bytes_per_param`) is
Megatron-LM's mixed-precision one.

    python -c "from traces.kernels import *; from traces.model import ModelSpec as M;
    print(layer_kernels(M(layers=1, hidden=4096, heads=32, seq_len=2048, vocab=1), 1, 1, False))"

The derivation in full: docs/kernel-costs.md.
"""

from __future__ import annotations

import dataclasses

from traces.fp8 import fp8_linear, fused_norm
from traces.heads import qk_norm_kernel
from traces.kernel_groups import ATTENTION_CORE
from traces.kernel_work import Gemm, KernelWork, gemm_kernel, memory_kernel
from traces.mla import down_width, q_in, qk_dim, v_dim
from traces.model import DTYPE_BYTES, ModelSpec
from traces.purpose import Kernel
from traces.torch_optim import foreach_step_kernel_bytes

__all__ = ["ATTENTION_CORE", "FUSED_SOFTMAX_MAX_SEQ", "Gemm", "KernelWork", "attention_kernels",
           "cross_entropy_bytes", "embedding_kernels", "gemm_kernel", "head_kernels",
           "layer_kernels", "memory_kernel", "mlp_activation", "optimizer_bytes_per_param",
           "rope_kernel", "softmax_bytes", "step_kernel_bytes"]
K = Kernel

def layer_kernels(model: ModelSpec, b: int, t: int, sp: bool,
                  grad_bytes: int | None = None, mlp_norm: bool = True) -> list[KernelWork]:
    """One layer's kernels in forward order, for one micro-batch on one TP rank.

    qkv's output is q (ad/t wide) and k, v (gd/t each): b·s·(ad + 2gd)/t, then qk_norm
    (`traces.heads`) with `model.qk_norm`; fc1's is f/t, or 2f/t for SwiGLU (Megatron-Core
    fuses the gate and up projections into one linear_fc1). In FP8, ln1 and ln2 are the norms
    of qkv's and fc1's LayerNormLinear (`traces.fp8.fused_norm`; not ln1 with latent
    attention, nor ln2 without `mlp_norm`: an MoE layer's TENorm)."""
    s, h, f, e = model.seq_len, model.hidden, model.ffn_hidden, model.dtype_bytes
    g = e if grad_bytes is None else grad_bytes
    r = s // t if sp else s  # tokens of the norms and dropouts on this rank
    qkv = (model.q_width + 2 * model.kv_width) // t
    linear = fp8_linear if model.fp8 else _linear
    shard = t if sp else 1  # qkv's and fc1's inputs are gathered from t ranks with SP
    ln1, ln2 = (_norm(name, b * r * h, e, residual=True) for name in (K.LN1, K.LN2))
    projections = mla_kernels(model, b, t, g, r) if model.mla else \
        linear(model, K.QKV, (1, b * s, qkv, h), g, fused=True, shard=shard)
    return [
        ln1 if model.mla else fused_norm(model, ln1, b * r * h),
        *projections,
        *([qk_norm_kernel(model, b, t)] if model.qk_norm else []),
        *([rope_kernel(model, b, t)] if model.position == "rope" else []),
        *attention_kernels(model, b, t),
        *linear(model, K.PROJ, (1, b * s, h, model.heads * v_dim(model) // t), g),
        _bda(K.BDA1, b * r * h, e, model.bias, model.dropout > 0),
        fused_norm(model, ln2, b * r * h) if mlp_norm else ln2,
        *linear(model, K.FC1, (1, b * s, model.fc1_width // t, h), g, fused=mlp_norm,
                shard=shard),
        mlp_activation(model, b, t),
        *linear(model, K.FC2, (1, b * s, h, f // t), g),
        _bda(K.BDA2, b * r * h, e, model.bias, model.dropout > 0),
    ]


def _linear(model: ModelSpec, name: Kernel, gemm: Gemm, grad_bytes: int,
            fused: bool = False, shard: int = 1) -> list[KernelWork]:
    """A linear layer in the model's dtype: one GEMM (`fused` and `shard` matter only in
    FP8)."""
    return [gemm_kernel(name, gemm, model.dtype_bytes, grad_bytes)]


def mla_kernels(model: ModelSpec, b: int, t: int, grad_bytes: int, rows: int
                ) -> list[KernelWork]:
    """Latent attention's projections (`traces.mla`), n = b·s tokens, in place of qkv; the
    down-projection and the norms run on n_r = b·`rows` tokens (s, or with SP the rank's s/t:
    Megatron-Core's duplicated down-projection takes the sequence shard):

    mla_down     GEMM (1, n_r, q_r + k_r + r, h), replicated: every TP rank runs it in full
    latent_norm  RMSNorm of c_q and c_kv, n_r·(q_r + k_r) elements: fwd read and write
                 2n_r(q_r + k_r)e, bwd read x and dy, write dx 3n_r(q_r + k_r)e
    q_up         GEMM (1, n, a(d + r)/t, q_r), or (1, n, a(d + r)/t, h) reading x itself
    kv_up        GEMM (1, n, a(d + d_v)/t, k_r)
    Each GEMM's bytes and backward are `gemm_kernel`'s; in FP8 `fp8_linear`'s, q_up and kv_up
    behind the latent norm of their LayerNormLinear (Megatron-Core's MLA spec:
    TELayerNormColumnParallelLinear, the down projections TELinear)."""
    n, e, a = b * model.seq_len, model.dtype_bytes, model.heads
    latents = b * rows * (model.q_lora_rank + model.kv_lora_rank)
    linear = fp8_linear if model.fp8 else _linear
    q_fused = model.q_lora_rank > 0
    return [
        *linear(model, K.MLA_DOWN, (1, b * rows, down_width(model), model.hidden), grad_bytes),
        fused_norm(model, memory_kernel(K.LATENT_NORM, 2 * latents * e, 3 * latents * e),
                   latents),
        *linear(model, K.Q_UP, (1, n, a * qk_dim(model) // t, q_in(model)), grad_bytes,
                fused=q_fused),
        *linear(model, K.KV_UP, (1, n, a * (model.head_dim + model.v_head_dim) // t,
                                 model.kv_lora_rank), grad_bytes, fused=True),
    ]


def mlp_activation(model: ModelSpec, b: int, t: int) -> KernelWork:
    """The MLP's activation over n = b·s·f/t outputs.

    gelu     fwd read x, write y: 2ne; bwd read x, dy, write dx: 3ne, and with biases the fc1
             bias gradient (Megatron's fused bias-GeLU) sums dx over tokens: +ne
    swiglu   fwd read gate and up, write silu(gate)·up: 3ne; bwd read gate, up, dy, write
             dgate, dup: 5ne, and with biases the fc1 bias gradient over both halves: +2ne"""
    b_s_f, e = b * model.seq_len * model.ffn_hidden, model.dtype_bytes
    bias = 1 if model.bias else 0
    if model.ffn == "swiglu":
        return memory_kernel(K.SWIGLU, 3 * b_s_f / t * e, (5 + 2 * bias) * b_s_f / t * e)
    return memory_kernel(K.GELU, 2 * b_s_f / t * e, (3 + bias) * b_s_f / t * e)


def rope_kernel(model: ModelSpec, b: int, t: int) -> KernelWork:
    """Rotary position embedding on q and k (Transformer Engine's fused RoPE): fwd reads the
    a/t query and g/t key heads of b·s·d each and writes them rotated, and reads the s×d fp32
    angle table: 2·b·s·(a + g)d/t·e + 4sd; bwd rotates dq and dk back, the same bytes."""
    s, d, e = model.seq_len, model.head_dim, model.dtype_bytes
    if model.mla:
        return _mla_rope(model, b, t)
    qk = b * s * (model.heads + model.kv_heads) * d // t
    both = 2 * qk * e + 4 * s * d
    return memory_kernel(K.ROPE, both, both)


def _mla_rope(model: ModelSpec, b: int, t: int) -> KernelWork:
    """Latent attention's rotary part, fused with the assembly of q and k as Megatron-Core's
    fused_apply_mla_rope_for_q/_kv do: per token, fwd reads q (a/t heads of d + r), k_nope
    (a/t of d) and the shared k_pe (r), writes q rotated and k = [k_nope | rotated k_pe] (a/t
    of d + r each), and reads the s×r fp32 angle table: b·s·(a/t·(4d + 3r) + r)·e + 4sr;
    bwd the same bytes (dq and dk in, dq, dk_nope and dk_pe summed over heads out)."""
    s, d, r, e = model.seq_len, model.head_dim, model.qk_rope_head_dim, model.dtype_bytes
    both = b * s * (model.heads * (4 * d + 3 * r) // t + r) * e + 4 * s * r
    return memory_kernel(K.ROPE, both, both)


FLASH_CAUSAL = 0.5
"""The share of the s x s score tiles a causal flash kernel computes: it skips the tiles above
the diagonal, and the FlashAttention benchmarks that give its rate (`sim.models.rates`) count a
causal kernel's FLOPs as half of 4·s²·d a head (Dao-AILab/flash-attention,
benchmarks/benchmark_flash_attention.py, `flops`: `// (2 if causal else 1)`). Context
parallelism's load-balanced chunks keep it exact on every ring step (`traces.plan.context`).
Megatron-LM's FLOP count for MFU keeps the full s² (`traces.step_flops`)."""

FLASH_BWD = 2.5
"""A flash kernel's backward over its forward's FLOPs: it recomputes QKᵀ and runs four more
products (dV, dP, dQ, dK), five to the forward's two; the same benchmark counts 2.5."""


def attention_kernels(model: ModelSpec, b: int, t: int) -> list[KernelWork]:
    """The attention core over a/t query heads and g/t key/value heads: one flash kernel, or
    Megatron-LM's unfused four.

    flash    the FLOPs it executes under the causal mask (`FLASH_CAUSAL`, `FLASH_BWD`): fwd
             half of QKᵀ and AV's 4·b·(a/t)·s²·d, bwd 2.5 times the forward's;
             fwd read Q (a/t heads of b·s·d), K, V (g/t heads each), write O (a/t) and the
             fp32 log-sum-exp: b·s·d·(2a + 2g)/t·e + 4·b·s·a/t
             bwd read Q, K, V, O, the log-sum-exp and dO, write dQ, dK, dV: the forward's
             bytes plus b·s·d·(2a + 2g)/t·e
             with dropout, one random draw per score it computes, b·(a/t)·s(s + 1)/2 under
             the causal mask, in forward and again in backward (it regenerates the mask
             rather than storing it)
    unfused  Megatron's DotProductAttention repeats K and V to all a/t heads before its
             batched GEMMs (when g < a): qk and av each also copy their g/t heads to a/t
             (read g, write a: b·s·d·(a + g)/t·e) and sum the gradient back in backward
             (the same bytes). attn_dropout draws one number per score, b·(a/t)·s²; with
             dropout = 0 it does not run (torch's dropout returns its input)."""
    s, a, e = model.seq_len, model.heads, model.dtype_bytes
    heads, kv = b * a // t, b * model.kv_heads // t
    d = model.head_dim
    if model.mla:
        return _mla_core(model, heads, s, e)
    if model.attention == "flash":
        flops = FLASH_CAUSAL * 4.0 * heads * s * s * d  # QKᵀ and AV: 2·b·s²·h/t each, full
        qkvo = (2 * heads + 2 * kv) * s * d * e
        lse = heads * s * 4
        grads = (2 * heads + 2 * kv) * s * d * e  # dO read, dQ, dK, dV written
        draws = _flash_draws(model, heads, s)
        return [KernelWork(K.FLASH_ATTN, flops, qkvo + lse, FLASH_BWD * flops,
                           qkvo + lse + grads, draws=draws, bwd_draws=draws)]
    scores = heads * s * s
    repeat = (heads + kv) * s * d * e if kv < heads else 0
    return [
        _plus(gemm_kernel(K.QK, (heads, s, s, d), e, e, weights=False), repeat),
        memory_kernel(K.SOFTMAX, *softmax_bytes(scores, s, heads, e)),
        *_attn_dropout(model, scores, e),
        _plus(gemm_kernel(K.AV, (heads, s, d, s), e, e, weights=False), repeat),
    ]


def _attn_dropout(model: ModelSpec, scores: int, e: int) -> list[KernelWork]:
    """Dropout on the probabilities: read, write and a 1-byte mask, a draw per score; none
    at dropout = 0."""
    if not model.dropout:
        return []
    both = scores * (2 * e + 1)
    return [memory_kernel(K.ATTN_DROPOUT, both, both, draws=scores)]


def _flash_draws(model: ModelSpec, heads: int, s: int) -> float:
    """Draws of flash attention's dropout: one per score at or below the causal diagonal."""
    return heads * s * (s + 1) / 2 if model.dropout else 0.0


def _mla_core(model: ModelSpec, heads: int, s: int, e: int) -> list[KernelWork]:
    """Latent attention's core over `heads` = b·a/t heads: q and k of d_qk = d + r, v and o of
    d_v, all full size. flash: QKᵀ 2·s²·d_qk and AV 2·s²·d_v FLOPs a head; fwd read q, k, v,
    write o and the fp32 log-sum-exp: heads·s·(2d_qk + 2d_v)·e + 4·heads·s; bwd the forward's
    bytes plus dO read and dQ, dK, dV written: heads·s·(2d_qk + 2d_v)·e. unfused: qk
    (heads, s, s, d_qk) and av (heads, s, d_v, s) GEMMs around the softmax and dropout."""
    dq, dv = qk_dim(model), v_dim(model)
    if model.attention == "flash":
        flops = FLASH_CAUSAL * 2.0 * heads * s * s * (dq + dv)
        qkvo = heads * s * (2 * dq + 2 * dv) * e
        lse = heads * s * 4
        draws = _flash_draws(model, heads, s)
        return [KernelWork(K.FLASH_ATTN, flops, qkvo + lse, FLASH_BWD * flops, 2 * qkvo + lse,
                           draws=draws, bwd_draws=draws)]
    scores = heads * s * s
    return [
        gemm_kernel(K.QK, (heads, s, s, dq), e, e, weights=False),
        memory_kernel(K.SOFTMAX, *softmax_bytes(scores, s, heads, e)),
        *_attn_dropout(model, scores, e),
        gemm_kernel(K.AV, (heads, s, dv, s), e, e, weights=False),
    ]


def _plus(k: KernelWork, extra: float) -> KernelWork:
    """`k` with `extra` bytes more each way (nothing added when `extra` is 0)."""
    if not extra:
        return k
    return dataclasses.replace(k, mem_bytes=k.mem_bytes + extra, bwd_bytes=k.bwd_bytes + extra)


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
    scatter-adds into the gradient table) and the position add with dropout (read, write, a
    1-byte mask: b·r·h·(2e + 1), and a draw per element; learned positions also read their
    r×h table, and in backward accumulate its gradient; with rotary positions, only the
    dropout; with dropout = 0 no mask and no draws)."""
    s, h, e = model.seq_len, model.hidden, model.dtype_bytes
    g = e if grad_bytes is None else grad_bytes
    r = s // t if sp else s
    table = model.position == "learned"
    mask = 1 if model.dropout else 0
    return [
        memory_kernel(K.EMBED, 2 * b * s * h * e, b * s * h * (e + 2 * g)),
        memory_kernel(K.POS_EMBED, b * r * h * (2 * e + mask) + (r * h * e if table else 0),
                      b * r * h * (2 * e + mask) + (2 * r * h * g if table else 0),
                      draws=b * r * h * mask),
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


def step_kernel_bytes(dtype: str, grad_bytes: int, optimizer: str = "fused"
                      ) -> tuple[tuple[Kernel, float], ...]:
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
    fp32 gradients (Megatron's rule for bf16): 4 + 8 + (28 + 6 + 4) = 50; fp32: 4 + 8 + 32.
    `optimizer = "foreach"`: torch.optim's AdamW instead (`traces.torch_optim`)."""
    if optimizer == "foreach":  # torch.optim's AdamW over FSDP2's fp32 shards
        return foreach_step_kernel_bytes(grad_bytes)
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
    """A LayerNorm or RMSNorm (the same traffic: read x and write y; backward read x and dy,
    write dx; their per-token statistics and h-element weights are too small to count);
    `residual`: its input is also the residual, whose two gradients autograd sums after the
    norm's backward (read both, write one)."""
    return memory_kernel(name, 2 * elements * e, (6 if residual else 3) * elements * e)


def _bda(name: Kernel, elements: int, e: int, bias: bool = True, dropout: bool = True
         ) -> KernelWork:
    """Bias-dropout-add: fwd read x and the residual, write y and a 1-byte mask: n(3e + 1),
    drawing a random number per element; bwd dropout's backward n(2e + 1), then the bias
    gradient's sum re-reads dx (+ne) — none without biases (Megatron's bias_dropout_add with
    bias None). Without `dropout` no mask and no draws: n·3e and n·2e (+ne)."""
    mask = 1 if dropout else 0
    return memory_kernel(name, elements * (3 * e + mask),
                         elements * (2 * e + mask + (e if bias else 0)),
                         draws=elements * mask)
