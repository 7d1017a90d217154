"""FP8 training as the frameworks run it: the kernels and bytes FP8 adds to a linear layer.

`dtype = "fp8"` runs every linear layer of a block as an FP8 GEMM at the accelerator's FP8
dense rate (`dtype = "fp4"`: an NVFP4 GEMM at its FP4 dense rate, the same machinery with
NVFP4's bytes and kernels, `traces.fp8_recipes`): qkv, proj, fc1, fc2 (latent attention:
mla_down, q_up, kv_up and proj; an MoE layer's routed experts at the FP8 rate without their
casts' bytes, `traces.moe`, and its shared experts as fc1 and fc2); everything else (norms,
attention core, activations, residuals, router, embedding, logits and cross-entropy) stays
bf16, and so do communication (but sequence parallelism's all-gathers, below), the stored
activations and parameters; the optimizer is bf16 mixed precision (fp32 master weights and
Adam moments). `fp8_recipe` chooses the scaling; `traces.fp8_recipes` says, recipe by recipe,
which casts, transposes and amax passes run around each GEMM and what they move.
Per linear Y = X·W of (M, N, K) on one micro-batch, with q_a and q_w bytes per FP8 activation
and weight element (an FP8 value and its scale's share):

    casts           fwd  X's (`input_casts`), before the GEMM
    GEMM            fwd  read X, W in FP8 (q_a·MK + q_w·KN), write Y in bf16 (2MN)
                    bwd  dgrad dX = dY·Wᵀ reads q_a·MN + q_w·KN, writes 2MK; wgrad dW = Xᵀ·dY
                         reads q_a·(MK + MN) and accumulates dW (read and write in the gradient
                         dtype)
    casts           bwd  dY's (`backward_casts`), before the GEMM's backward
    fp8_weight_cast once a step, after the optimizer (TE keeps the FP8 weights of the first
                    micro-batch for the rest, Megatron's is_first_microbatch): every FP8 GEMM
                    weight of the rank's layers (`fp8_weights_per_layer`)

Where Transformer Engine fuses a cast into the norm before the linear (LayerNormLinear:
`traces.fp8_recipes`), `fused_norm` moves the cast's write into the norm. With sequence
parallelism TE casts the sequence shard and all-gathers it quantized: the plan's SP all-gathers
into qkv and fc1 (and of proj's and fc2's output gradient) carry q_a bytes an element where
the recipe does so (`Fp8Recipe.sp_gather`, `traces.plan.tensor`'s quantized gathers; the
reduce-scatters stay bf16), and qkv's and fc1's input casts run over the rank's b·s/t rows
before the gather (`traces.fp8_recipes.gathered_input_casts`: per-tensor scales cast the
row-wise copy there, a fused norm writes it, and the transpose of the gathered copy runs in
backward). The output gradient's casts are still costed over the gathered b·s rows (they sit
just before its all-gather in the plan).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from traces import mla
from traces.fp8_recipes import (
    FP8_RECIPES,
    RECIPES,
    Fp8Recipe,
    backward_casts,
    fused_norm_bytes,
    gathered_input_casts,
    input_casts,
)
from traces.kernel_work import Gemm, KernelWork
from traces.model import ModelSpec
from traces.moe_spec import is_moe_layer
from traces.purpose import Kernel

__all__ = ["FP8_RECIPES", "amax_bytes", "fp8_gemm_rate", "fp8_gemms_per_layer", "fp8_linear",
           "fp8_weights_per_layer", "fused_norm", "recipe", "weight_cast_bytes"]
BF16 = 2
AMAX_BYTES = 4
AMAX_FWD, AMAX_BWD = 3, 2
"""fp32 amaxes per GEMM that delayed scaling reduces: input, weight, output forward; output
gradient and input gradient backward (TE's FP8 meta tensors)."""


def recipe(model: ModelSpec) -> Fp8Recipe:
    """The model's FP8 recipe (delayed where none is named), or its FP4 one (NVFP4); tensorwise
    under the eager and compiled stacks is torchao's, which casts the weights at each forward
    (`Fp8Recipe.weight_per_forward`)."""
    if model.fp4:
        return RECIPES[model.fp4_recipe]
    rec = RECIPES[model.fp8_recipe or "delayed"]
    if rec.name == "tensorwise" and model.kernels != "fused":  # torchao's Float8Linear
        return dataclasses.replace(rec, weight_per_forward=True)
    return rec


def fp8_gemm_rate(model: ModelSpec) -> float:
    """The model's quantized GEMMs' rate as a fraction of the accelerator's dense rate in
    their format, FP8 or FP4 (MXFP8's block-scaled GEMMs run slower,
    `traces.fp8_recipes.MXFP8_GEMM_RATE`); 1 without FP8."""
    return recipe(model).gemm_rate if model.fp8 else 1.0


def fp8_linear(model: ModelSpec, name: Kernel, gemm: Gemm, grad_bytes: int,
               fused: bool = False, shard: int = 1) -> list[KernelWork]:
    """The casts of X, the FP8 GEMM and the casts of dY, in forward order (module docstring);
    `fused`: X is the output of a LayerNormLinear's norm; `shard` > 1: SP gathers X from that
    many ranks, and where TE quantizes before the gather (`Fp8Recipe.sp_gather`) X's casts run
    over the rank's shard (`traces.fp8_recipes.gathered_input_casts`)."""
    batch, m, n, k = gemm
    rec = recipe(model)
    qa, qw = rec.q_act, rec.q_weight
    a, b, c = batch * m * k, batch * k * n, batch * m * n
    flops = 2.0 * batch * m * n * k
    forward = qa * a + qw * b + BF16 * c
    backward = (qa * c + qw * b + BF16 * a) + (qa * (a + c) + 2 * b * grad_bytes)
    non_tn = model.fp8_non_tn
    before, transpose = gathered_input_casts(rec, a, b, fused, shard, non_tn) \
        if shard > 1 and rec.sp_gather else (input_casts(rec, a, b, fused, non_tn), [])
    return [*before,
            KernelWork(name, flops, forward, 2 * flops, backward, gemm, fp8=True,
                       fp4=model.fp4),
            *transpose, *backward_casts(rec, a, b, c, non_tn)]


def fused_norm(model: ModelSpec, norm: KernelWork, elements: int) -> KernelWork:
    """`norm` writing its `elements` outputs in FP8 for a LayerNormLinear, where the recipe
    fuses the cast (delayed), else `norm` as it is."""
    rec = recipe(model)
    if not (model.fp8 and rec.norm_copies):
        return norm
    write = fused_norm_bytes(rec, elements) - BF16 * elements
    return dataclasses.replace(norm, mem_bytes=norm.mem_bytes + write)


def fp8_weights_per_layer(model: ModelSpec, layer: int, tp: int, ep: int = 1,
                          etp: int = 1) -> float:
    """Elements of one layer's FP8 GEMM weights on one rank. Attention: qkv h(q + 2gd) and
    proj qh over t (q = ad, h when d = h/a); latent attention: mla_down h(q_r + k_r + r) on
    every rank, q_up, kv_up and proj over t. MLP: fc1 h·f1 and fc2 fh over t; an MoE layer:
    its E/ep routed experts' over etp and its shared experts' over t (the router stays
    bf16)."""
    h = model.hidden
    if model.mla:
        split, _ = mla.mla_params(model)
        attn = split / tp + h * mla.down_width(model)
    else:
        q = model.q_width
        attn = (h * (q + 2 * model.kv_width) + q * h) / tp
    if not is_moe_layer(model, layer):
        return attn + (h * model.fc1_width + model.ffn_hidden * h) / tp
    f = model.moe_ffn_hidden
    expert = h * (2 * f if model.ffn == "swiglu" else f) + f * h
    return attn + model.experts / ep * expert / etp + model.shared_experts * expert / tp


def fp8_gemms_per_layer(model: ModelSpec, layer: int, ep: int = 1) -> int:
    """FP8 GEMMs of one layer on one rank, each with its own scaling state: 4 (qkv, proj, fc1,
    fc2); latent attention 6 (mla_down, q_up, kv_up, proj, fc1, fc2); an MoE layer's MLP the
    E/ep local experts' fc1 and fc2 (TE's GroupedLinear keeps one state per GEMM) and the
    shared experts' fc1 and fc2."""
    attn = 4 if model.mla else 2
    if not is_moe_layer(model, layer):
        return attn + 2
    return attn + 2 * model.experts // ep + (2 if model.shared_experts else 0)


def weight_cast_bytes(model: ModelSpec, layers: Iterable[int], tp: int, ep: int = 1,
                      etp: int = 1) -> float:
    """The step's cast of `layers`' FP8 weights (and second copies): 0 where the recipe casts
    at every use (`traces.fp8_recipes`); one copy for a per-tensor scale where the GEMMs take
    non-TN layouts (`ModelSpec.fp8_non_tn`)."""
    per = recipe(model).weight_cast_per_element(model.fp8_non_tn)
    return per * sum(fp8_weights_per_layer(model, i, tp, ep, etp) for i in layers)


def amax_bytes(model: ModelSpec, layers: Iterable[int], backward: bool, ep: int = 1) -> float:
    """Delayed scaling's amax all-reduce after a pass over `layers` (0 for other recipes)."""
    if not recipe(model).history:
        return 0.0
    per_gemm = AMAX_BWD if backward else AMAX_FWD
    return AMAX_BYTES * per_gemm * sum(fp8_gemms_per_layer(model, i, ep) for i in layers)
