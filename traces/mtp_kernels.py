"""A multi-token prediction depth's own kernels (`traces.mtp`), before its transformer layer,
for one micro-batch on one TP rank: FLOPs and HBM bytes.

Megatron-Core's MultiTokenPredictionLayer.forward (megatron/core/transformer/
multi_token_prediction.py) runs, after the shifted tokens' embedding lookup:

    mtp_enorm    enorm of the embedding: an RMSNorm over the rank's n = b·r·h values (r = s/t
                 with SP, else s), read x, write y; backward read x and dy, write dx (3n·e)
    mtp_hnorm    hnorm of the previous depth's hidden state (the main model's output for the
                 first depth): the same, and that state's two gradients (this and the main
                 head's) summed after its backward (6n·e), as a residual norm's
    mtp_concat   torch.cat of the two to 2h wide: read 2n·e, write 2n·e; its backward hands
                 each norm a view of the gradient (no kernel)
    eh_proj      the column-parallel 2h -> h linear without bias: GEMM (1, b·s, h/t, 2h),
                 2·b·s·2h·h/t FLOPs forward (Megatron-LM's 2h^2 a token), in FP8 with its
                 casts on an fp8 model

Its layer, final norm, logits and cross-entropy are the main model's kernels (`traces.plan.
compute` runs them per depth). The TP collectives around eh_proj (an all-gather of its SP
input, and of its output before the layer) are not in this list.
"""

from __future__ import annotations

from traces.fp8 import fp8_linear
from traces.kernel_work import KernelWork, gemm_kernel, memory_kernel
from traces.model import ModelSpec
from traces.purpose import Kernel

K = Kernel


def mtp_kernels(model: ModelSpec, b: int, t: int, sp: bool, grad_bytes: int
                ) -> list[KernelWork]:
    """One depth's enorm, hnorm, concatenation and eh_proj in forward order (module
    docstring)."""
    s, h, e = model.seq_len, model.hidden, model.dtype_bytes
    n = b * (s // t if sp else s) * h
    gemm = (1, b * s, h // t, 2 * h)
    proj = fp8_linear(model, K.EH_PROJ, gemm, grad_bytes) if model.fp8 else \
        [gemm_kernel(K.EH_PROJ, gemm, e, grad_bytes)]
    return [memory_kernel(K.MTP_ENORM, 2 * n * e, 3 * n * e),
            memory_kernel(K.MTP_HNORM, 2 * n * e, 6 * n * e),
            memory_kernel(K.MTP_CONCAT, 4 * n * e, 0.0),
            *proj]
