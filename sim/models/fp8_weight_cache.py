"""The FP8 copies of the weights that Transformer Engine keeps between micro-batches.

Megatron-Core calls every TE linear with `is_first_microbatch` (extensions/
transformer_engine.py @d086a2e, TELinear / TEGroupedLinear.forward: `_is_first_microbatch =
None if self.disable_parameter_transpose_cache else self.is_first_microbatch`, set True again
by each step's first forward_step, pipeline_parallel/schedules.py `set_is_first_microbatch`),
and TE then quantizes the weight into a cached workspace on the first micro-batch and reuses
it until the optimizer step (TE @fecb10b module/base.py `get_weight_workspace`:
`self._fp8_workspaces[cache_name]`, built with `quantizer.internal = False` "as it persists
beyond a single forward pass"; module/linear.py @3ec8787: `cache_name=(None if
is_first_microbatch is None else "weight")`, the weight quantizer set to `rowwise=True,
columnwise=is_grad_enabled and inp.requires_grad`). So in training the cached copy holds both
usages, per weight element:

    delayed, tensorwise  Float8Tensor: the data, and on Hopper its transpose for the backward
                         GEMMs (FP8 GEMMs there take only "TN"; base.py drops a cached copy
                         without `_transpose` when `not is_non_tn_fp8_gemm_supported()`); on
                         Blackwell the row-wise data serves both: 2 or 1 bytes
    blockwise            row-wise and column-wise copies, a 128x128 block's fp32 scale each:
                         2(1 + 4/128²)
    mxfp8                row-wise and column-wise MXFP8 copies with their E8M0 scales, one a
                         32 values (`_rowwise_data`, `_columnwise_data`): 2(1 + 1/32)
    nvfp4                row-wise and column-wise NVFP4 copies (NVFP4Tensor's
                         `_rowwise_data`, `_columnwise_data`), an E4M3 scale a 16 values each:
                         2(1/2 + 1/16)
    rowwise (torchao)    none: torchao's Float8Linear casts the weight at every use and
                         caches nothing (float8_linear.py), nor does any recipe under
                         `kernels = "compiled"` / "eager"

Counted as working memory held all step (a workspace, not checkpointed), per TE linear of the
rank's transformer layers at its TP / EP share, unsharded by ZeRO 0-2 (each rank casts the
whole weight it computes with). Not counted: ZeRO 3 (Megatron-FSDP gathers per unit; TE's
cached workspace is then resharded, base.py `_fsdp_gather_tensors`), the embedding and the
output layer (Megatron-Core runs them outside TE), `fp8_activation_cache` (DeepSeek's own
framework, not TE).

With `fp8_param_gather` (`traces.fp8_params`) the weight is itself the quantized tensor:
TE's `get_weight_workspace` returns it ("Handle case where weights are already quantized",
`update_usage` adding the column-wise copy and keeping it) and no bf16 copy exists, so the
same FP8 bytes replace the weight's bf16 ones instead of adding to them.

`non_tn` stands for TE's `is_non_tn_fp8_gemm_supported()` (compute capability 10.0 and up),
which the presets mark by `Accelerator.fp8_block_scaling`: both are Blackwell's.
"""

from __future__ import annotations

from sim.models.moe_memory import rank_layers
from traces.fp8 import recipe
from traces.layout import Layout
from traces.model import ModelSpec


def caches_fp8_weights(model: ModelSpec, layout: Layout) -> bool:
    """Whether TE's weight workspaces are held: FP8 GEMMs on the fused (Megatron-Core / TE)
    stack with a TE recipe, ZeRO below 3, and not DeepSeek's `fp8_activation_cache` rule."""
    return (model.fp8 and model.kernels == "fused" and model.fp8_recipe != "rowwise"
            and layout.zero < 3 and not layout.fp8_activation_cache)


def cache_bytes_per_weight(model: ModelSpec, non_tn: bool) -> float:
    """Bytes of TE's cached FP8 copies per weight element (module docstring); `non_tn`: the
    accelerator's FP8 GEMMs take every layout (Blackwell), so per-tensor scaling needs no
    transpose (`Fp8Recipe.copies`)."""
    fp8 = recipe(model)
    return fp8.copies(non_tn) * fp8.q_weight


def fp8_weight_cache_bytes(model: ModelSpec, layout: Layout, pp_rank: int,
                           non_tn: bool = False) -> float:
    """Bytes of TE's cached FP8 weights on one GPU of pipeline rank `pp_rank`: its transformer
    layers' parameters at their TP / EP share (norms, biases and an MoE router among them,
    O(h) against the weights' O(h²)) times `cache_bytes_per_weight`, less their bf16 bytes
    with `fp8_param_gather`; 0 where none is kept."""
    if not caches_fp8_weights(model, layout):
        return 0.0
    params = model.layers_params(rank_layers(model, layout, pp_rank), layout.tp, layout.ep,
                                 layout.etp)
    bf16 = model.dtype_bytes if layout.fp8_param_gather else 0
    return params * (cache_bytes_per_weight(model, non_tn) - bf16)
