"""What Transformer Engine's FP8 modules keep for the backward, against the bf16 count of
`sim.models.activation_memory.activation_terms` (bytes per s·b·h; q = the recipe's scale
bytes per FP8 value, `traces.fp8_recipes.Fp8Recipe.act_scale`: 0 for per-tensor scales,
4/128 for 1x128 blocks, 1/32 for MXFP8's E8M0 bytes):

    replicated  qkv's and fc1's inputs (the norm outputs): FP8, 1 + q each instead of 2;
                the norms' inputs stay bf16 (LayerNormLinear saves inputmat, mu, rsigma)
    split       proj's input: the attention core keeps its output in bf16 (FusedAttnFunc
                saves q, k, v and out), and proj (TE's Linear) quantizes it and saves its
                own FP8 copy: + (1 + q)·ad/h; with the core recomputed (selective) the bf16
                output is not kept, so the copy replaces it: 2 -> 1 + q
                fc2's input (the activation's output, not kept by the activation, which
                keeps its own input in bf16): FP8, 1 + q instead of 2: f/h (SwiGLU) or 4
                (GeLU's literal f = 4h) elements
    Q, K, V, the activation's input, masks: bf16 as before

Sources (Transformer Engine, transformer_engine/pytorch): module/layernorm_linear.py, forward:
the norm output is quantized (in the norm kernel or just after it) before the SP gather, and
before saving `ln_out.update_usage(rowwise_usage=False)` keeps only the column-wise copy for
the wgrad GEMM (for MXFP8 and block scaling always, "For MXFP8, columnwise only data can be
allgathered"; for per-tensor scaling the row-wise data where it is gathered again under SP);
module/linear.py: "Discard row-wise data since it is not needed in backward pass"
(`inputmat.update_usage(rowwise_usage=False, columnwise_usage=True)`) on the quantized input
it saves; attention/dot_product_attention (FusedAttnFunc.forward): `qkvo_tensors = (q, k, v,
out_save)` when the attention itself is not FP8. Either copy is one byte a value: Hopper's
per-tensor transpose, Blackwell's column-wise data, MXFP8's column-wise data with its E8M0
scales. So TE keeps one FP8 copy per saved linear input, not both.

Not counted here: latent attention (its down-projections read one norm output through two
linears, each with its own FP8 copy; DeepSeek-V3's rows state `fp8_activation_cache`
instead), the routed experts' grouped GEMMs (counted in bf16 as before,
`sim.models.saved_activations.moe_mlp_terms`).
"""

from __future__ import annotations

from traces.fp8 import recipe
from traces.layout import Layout
from traces.model import ModelSpec
from traces.recompute import recomputes_core

GELU_FC2_VALUES = 4
"""fc2's input values per s·b·h in the GeLU MLP's literal f = 4h (`GELU_MLP_TERM`)."""


def te_fp8(model: ModelSpec, layout: Layout) -> bool:
    """Whether TE's FP8 saving applies: FP8 GEMMs on the fused (Megatron-Core / TE) stack,
    without `fp8_activation_cache` (which states DeepSeek's own rule) or latent attention.
    torchao (`kernels = "compiled"` / "eager", and its "rowwise" recipe on any stack) saves
    the bf16 input and casts again in backward (float8_linear.py's
    matmul_with_hp_or_float8_args saves input_hp)."""
    return (model.fp8 and model.kernels == "fused" and model.fp8_recipe != "rowwise"
            and not layout.fp8_activation_cache and not model.mla)


def te_fp8_mlp(model: ModelSpec, layout: Layout) -> float:
    """Bytes per s·b·h that fc2's FP8 input spares against bf16: 1 - q per value (NVFP4's
    2 - q_act, its value half a byte)."""
    q = recipe(model).q_act
    values = model.ffn_hidden / model.hidden if model.ffn == "swiglu" else GELU_FC2_VALUES
    return values * (2 - q)


def te_fp8_terms(model: ModelSpec, layout: Layout) -> tuple[float, float, float]:
    """(replicated, split, latent) bytes per s·b·h spared (negative: added), module docstring;
    `recompute_modules = ["layernorm"]` keeps no norm output at all (4, as in bf16)."""
    q = recipe(model).q_act  # 1 + the scale's share; NVFP4's 1/2 + 1/16
    replicated = 4.0 if "layernorm" in layout.recompute_modules else 2 * (2 - q)
    proj = model.q_width / model.hidden  # ad/h values of proj's input
    proj_saving = proj * (2 - q) if recomputes_core(layout) else -proj * q
    return replicated, te_fp8_mlp(model, layout) + proj_saving, 0.0
