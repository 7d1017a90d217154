"""FP8 training as Transformer Engine runs it: the kernels and bytes FP8 adds to a linear layer.

`dtype = "fp8"` runs the four linear layers of each block (qkv, proj, fc1, fc2) as FP8 GEMMs at
the accelerator's FP8 dense rate; everything else (norms, attention core, activations,
residuals, embedding, logits and cross-entropy) stays bf16, and so do communication, the stored
activations and parameters; the optimizer is bf16 mixed precision (fp32 master weights and
Adam moments). Per linear layer Y = X·W of (M, N, K) on one micro-batch, q bytes per FP8 element
(1, or 1 + 1/32 with MXFP8's one E8M0 scale per 32 values):

    fp8_cast        fwd  cast X to FP8 and its second copy for the weight gradient:
                         read 2MK, write 2qMK
    GEMM            fwd  read X, W in FP8 (qMK + qKN), write Y in bf16 (2MN)
                    bwd  dgrad dX = dY·Wᵀ reads qMN + qKN, writes 2MK; wgrad dW = Xᵀ·dY reads
                         qMK + qMN and accumulates dW (read and write in the gradient dtype)
    fp8_cast_grad   bwd  cast dY to FP8 and its second copy: read 2MN, write 2qMN
    fp8_weight_cast once a step, after the optimizer (TE keeps the FP8 weights of the first
                    micro-batch for the rest, Megatron's is_first_microbatch): every GEMM weight
                    read 2, written 2q per element

Hopper's FP8 tensor cores take only the "TN" operand layout, so the second copies are
physical transposes (TE's fused cast-transpose), and the per-tensor scaling factors come from an
amax history that the `traces.plan.fp8` pass all-reduces after each stage's forward and
backward (delayed scaling: fp32 amaxes, three per GEMM forward, two backward). Blackwell's
MXFP8 (block scaling, TE's MXFP8BlockScaling, the default on Blackwell presets) takes every
layout, but a 1-D block of 32 scales along one dimension only, so the second copy is a
columnwise-quantized one of the same size rather than a transpose; the scales add 1/32 byte per
element; and scales come from each block's own values, so there is no amax reduction.
With sequence parallelism TE casts the sequence shard and all-gathers it in FP8; here
communication stays bf16 and the cast is costed over the gathered b·s rows (it sits just
before the all-gather in the plan). Transformer Engine fuses some casts into the kernel before
(the norm in LayerNormLinear, the activation in LayerNormMLP); they are counted here as kernels
of their own, which costs one bf16 read of X more than TE's fused kernels.
"""

from __future__ import annotations

from traces.kernel_work import Gemm, KernelWork
from traces.model import FP8_RECIPES, ModelSpec
from traces.purpose import Kernel

__all__ = ["FP8_RECIPES", "amax_bytes", "fp8_element_bytes", "fp8_linear", "weight_cast_bytes"]
MX_BLOCK = 32
"""MXFP8: one E8M0 scale byte per 32 consecutive values (OCP Microscaling spec, TE docs)."""
BF16 = 2
AMAX_BYTES = 4
AMAX_FWD, AMAX_BWD = 3, 2
"""fp32 amaxes per GEMM that delayed scaling reduces: input, weight, output forward; output
gradient and input gradient backward (TE's FP8 meta tensors)."""
FP8_GEMMS_PER_LAYER = 4  # qkv, proj, fc1, fc2


def fp8_element_bytes(model: ModelSpec) -> float:
    """q: an FP8 value plus its share of a block scale."""
    return 1 + 1 / MX_BLOCK if model.fp8_recipe == "mxfp8" else 1.0


def fp8_linear(model: ModelSpec, name: Kernel, gemm: Gemm, grad_bytes: int) -> list[KernelWork]:
    """The cast of X, the FP8 GEMM and the cast of dY, in forward order (module docstring)."""
    batch, m, n, k = gemm
    q = fp8_element_bytes(model)
    a, b, c = batch * m * k, batch * k * n, batch * m * n
    flops = 2.0 * batch * m * n * k
    forward = q * (a + b) + BF16 * c
    backward = (q * (c + b) + BF16 * a) + (q * (a + c) + 2 * b * grad_bytes)
    return [KernelWork(Kernel.FP8_CAST, 0.0, (BF16 + 2 * q) * a, 0.0, 0.0),
            KernelWork(name, flops, forward, 2 * flops, backward, gemm, fp8=True),
            KernelWork(Kernel.FP8_CAST_GRAD, 0.0, 0.0, 0.0, (BF16 + 2 * q) * c)]


def fp8_weights_per_layer(model: ModelSpec, tp: int) -> float:
    """Elements of one layer's FP8 GEMM weights on one TP rank: h(q + 2gd) + qh + h·f1 + fh,
    q = ad (h when d = h/a)."""
    h, f, q = model.hidden, model.ffn_hidden, model.q_width
    return (h * (q + 2 * model.kv_width) + q * h + h * model.fc1_width + f * h) / tp


def weight_cast_bytes(model: ModelSpec, num_layers: int, tp: int) -> float:
    """The step's cast of `num_layers` layers' weights to FP8 (and the second copy)."""
    return num_layers * fp8_weights_per_layer(model, tp) * (BF16 + 2 * fp8_element_bytes(model))


def amax_bytes(model: ModelSpec, num_layers: int, backward: bool) -> float:
    """Delayed scaling's amax all-reduce after a pass over `num_layers` layers (0 with MXFP8)."""
    if model.fp8_recipe != "delayed":
        return 0.0
    per_gemm = AMAX_BWD if backward else AMAX_FWD
    return AMAX_BYTES * per_gemm * FP8_GEMMS_PER_LAYER * num_layers
