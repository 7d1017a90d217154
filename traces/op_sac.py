"""torchtitan's per-op selective activation checkpointing: `[parallel] recompute = "selective_op"`.

torchtitan's `selective_ac_option = "op"` (pytorch/torchtitan torchtitan/parallelisms/
parallelize_llama.py, `_save_list` and `_apply_ac_to_transformer_block`, @004b314, the code of
the published December 2024 tables) wraps each transformer block in a selective checkpoint
whose policy saves the outputs of `aten.mm`, the SDPA flash / efficient attention ops and
`_c10d_functional.reduce_scatter_tensor`, except every second `aten.mm` (a counter of the
block's mm calls in forward order: an even count is not saved); every other op is recomputed
in backward. A Llama block calls mm for wq, wk, wv, wo, w1, w3, w2 in that order (its
FeedForward computes w2(silu(w1(x)) * w3(x))): wq, wv, w1 and w2 are saved, wk, wo and w3 are
recomputed, with every norm, RoPE, activation and residual add. A Float8 linear multiplies
with `aten._scaled_mm`, which is not in the list (and not counted): all of its GEMMs are
recomputed.

parasim's kernels fuse wq, wk and wv into one `qkv` GEMM and w1, w3 into one `fc1` (of 2f
for SwiGLU): the recomputed part of such a kernel is its columns of the recomputed mms, a GEMM
of the same M and K over those columns (`recomputed_kernels`). The backward needs the block's
unsaved tensors from its first kernel (w2's weight gradient reads silu(w1)·w3), so the
recomputation runs before the layer's backward, as `full` does.

Stored per layer (`saved_bytes`): the block's input, the saved mm outputs and the attention's
output with its fp32 log-sum-exp, and with sequence parallelism the reduce-scattered outputs.
"""

from __future__ import annotations

import dataclasses

from traces.errors import ConfigError
from traces.kernel_work import KernelWork
from traces.layout import Layout
from traces.model import ModelSpec
from traces.purpose import Kernel

K = Kernel
SAVED_CORE = frozenset({K.FLASH_ATTN})
"""The attention core whose output the policy saves (SDPA's flash / efficient attention)."""
LSE_BYTES = 4
"""Flash attention's log-sum-exp per query row and head, fp32."""


def mm_widths(model: ModelSpec, name: Kernel) -> tuple[int, ...]:
    """The output widths (before TP) of the `aten.mm` calls one GEMM kernel stands for, in
    forward order: qkv is wq, wk, wv; fc1 is w1 then w3 with SwiGLU; every other GEMM one."""
    if name is K.QKV:
        return (model.q_width, model.kv_width, model.kv_width)
    if name is K.FC1 and model.ffn == "swiglu":
        return (model.ffn_hidden, model.ffn_hidden)
    return (0,)


def check(model: ModelSpec) -> None:
    """The rule is torchtitan's for dense blocks; latent attention and MoE are refused."""
    if model.mla or model.experts:
        raise ConfigError("parallel.recompute: 'selective_op' is torchtitan's per-op rule for "
                          "dense blocks; use 'selective' or 'full' with latent attention or "
                          "experts")


def recomputed_kernels(model: ModelSpec, layer: list[KernelWork]) -> list[KernelWork]:
    """The forward kernels of `layer` (in forward order) that the backward re-runs: every
    kernel but the saved attention core, and of each bf16 GEMM its columns of the even mms."""
    check(model)
    count, out = 0, []
    for k in layer:
        if k.name in SAVED_CORE:
            continue
        if k.gemm is None or k.fp8:  # a memory-bound op, or _scaled_mm: never saved
            out.append(k)
            continue
        widths = mm_widths(model, k.name)
        recomputed = []
        for width in widths:
            count += 1
            if count % 2 == 0:
                recomputed.append(width)
        if recomputed:
            out.append(_columns(k, sum(recomputed) / sum(widths) if widths != (0,) else 1.0))
    return out


def _columns(k: KernelWork, share: float) -> KernelWork:
    """GEMM `k` over `share` of its output columns: FLOPs, B and C in proportion, A whole."""
    assert k.gemm is not None
    batch, m, n, kk = k.gemm
    cols = round(n * share)
    a, b, c = batch * m * kk, batch * kk * n, batch * m * n
    e = k.mem_bytes / (a + b + c)
    return dataclasses.replace(k, flops=2.0 * batch * m * cols * kk,
                               mem_bytes=(a + (b + c) * cols / n) * e,
                               gemm=(batch, m, cols, kk))


def recompute_flops_per_token(model: ModelSpec) -> float:
    """The GEMM FLOPs recomputed per token and layer, before TP (the memory-bound ops have
    none): the even mms of wq, wk, wv, wo, w1[, w3], w2 in bf16; every projection in FP8."""
    check(model)
    h, q, kv, f = model.hidden, model.q_width, model.kv_width, model.ffn_hidden
    mms = [q, kv, kv, h, *((f, f) if model.ffn == "swiglu" else (f,)), h]
    ins = [h, h, h, q, *((h, h) if model.ffn == "swiglu" else (h,)), f]
    if model.fp8:
        return sum(2.0 * n * k for n, k in zip(mms, ins))
    return sum(2.0 * n * k for i, (n, k) in enumerate(zip(mms, ins), 1) if i % 2 == 0)


def saved_bytes(model: ModelSpec, layout: Layout) -> float:
    """Activations one layer stores for one micro-batch on one rank: the block's input x
    (its sequence shard with SP), the saved mm outputs (wq, wv, w1, w2 in bf16; none in FP8),
    sdpa's output with its fp32 log-sum-exp, and with SP the two reduce-scatters' outputs.
    Activations in 2 bytes (bf16 even where the GEMMs run in FP8)."""
    check(model)
    e, t = 2, layout.tp
    s, b = model.seq_len // layout.cp, layout.micro_batch
    h, q, kv, f, a = model.hidden, model.q_width, model.kv_width, model.ffn_hidden, model.heads
    shard = t if layout.sp else 1
    tokens = s * b
    kept = tokens * h / shard + tokens * q / t + LSE_BYTES / e * tokens * a / t
    if not model.fp8:
        kept += tokens * (q + kv + f) / t + tokens * h  # wq, wv, w1; w2 before its reduction
    if t > 1 and layout.sp:
        kept += 2 * tokens * h / t  # the reduce-scattered outputs of wo and w2
    return e * kept
