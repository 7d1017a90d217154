"""Megatron-Core's `--fp8-param-gather` (`[parallel] fp8_param_gather`): FP8 primary weights.

With it Megatron builds the Transformer Engine modules under TE's `fp8_model_init`, so each TE
linear's weight is a quantized tensor and no bf16 copy of it exists (the distributed
optimizer keeps the fp32 main weights, already in its 12 bytes a parameter). Megatron-Core's
param_and_grad_buffer files a Float8Tensor parameter under a uint8 buffer (`param_dtype =
torch.uint8 if is_float8tensor(param) else param.dtype`), so the distributed optimizer's
parameter all-gather moves one byte an element for per-tensor scaling; MXFP8 parameters do
not map into that buffer (TE's `replace_raw_data` does not take MXFP8's tiles) and their
all-gather runs in the gradient buffer (`--reuse-grad-buf-for-mxfp8-param-ag`, which
Megatron-Bridge's MXFP8 recipe sets with it), counted here at the parameters' bf16 width.
Megatron-Bridge's FP8 recipes set it (training/mixed_precision.py @0509780:
`bf16_with_fp8_delayed_scaling_mixed`, `bf16_with_fp8_current_scaling_mixed`,
`bf16_with_mxfp8_mixed`; not the blockwise `bf16_with_fp8_subchannel_scaling_mixed`).
The embedding, the output layer and the norms stay in bf16. The weight's FP8
copies then live in the parameter itself rather than in TE's workspace
(`sim.models.fp8_weight_cache`); their bytes are the same.

Needs TE's FP8 (`kernels = "fused"`, a recipe other than torchao's "rowwise") and ZeRO 1 or 2
(Megatron asserts the distributed optimizer or FSDP; Megatron-FSDP's FP8 path is not
modelled, so ZeRO 3 is refused).
"""

from __future__ import annotations

from traces.errors import ConfigError
from traces.fp8 import recipe
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe_spec import expert_params, is_moe_layer


def check_fp8_param_gather(model: ModelSpec, layout: Layout) -> None:
    """One line refusing `fp8_param_gather` where Megatron-Core (or this model of it) has no
    FP8 primary weights."""
    if not layout.fp8_param_gather:
        return
    key = "parallel.fp8_param_gather: true"
    if model.dtype != "fp8" or model.kernels != "fused" or model.fp8_recipe == "rowwise":
        raise ConfigError(f"{key} needs Transformer Engine's FP8 weights (model.dtype = "
                          "\"fp8\", kernels = \"fused\", a recipe other than \"rowwise\"; "
                          "NVFP4's recipe sets it false)")
    if layout.zero not in (1, 2):
        raise ConfigError(f"{key} needs zero = 1 or 2 (Megatron's distributed optimizer)")
    if layout.fp8_activation_cache:
        raise ConfigError(f"{key} is Megatron-Core's; fp8_activation_cache states DeepSeek's "
                          "own training framework")


def rank_layers(model: ModelSpec, layout: Layout, pp_rank: int) -> list[int]:
    """The layer indices pipeline rank `pp_rank` holds over all its chunks."""
    return [layer for stage in layout.stages_of_rank(pp_rank)
            for layer in layout.layers_of_stage(model, stage)]


def gathered_bytes(model: ModelSpec) -> float:
    """Bytes the parameter all-gather moves per TE linear weight element: the FP8 data (with
    a 128x128 block's scale for blockwise) or, for MXFP8, the bf16 width (module
    docstring)."""
    fp8 = recipe(model)
    return float(model.dtype_bytes) if fp8.name == "mxfp8" else 1 + fp8.weight_scale


def expert_param_bytes(model: ModelSpec, layout: Layout) -> float:
    """Bytes a routed expert's parameter moves in its expert-DP all-gather: TE's grouped
    linears are FP8 parameters too under `fp8_param_gather` (`gathered_bytes`)."""
    return gathered_bytes(model) if layout.fp8_param_gather else float(model.dtype_bytes)


def param_gather_bytes(model: ModelSpec, layout: Layout, pp_rank: int) -> float:
    """Bytes a parameter of pipeline rank `pp_rank`'s dense (non-routed-expert) states
    averages in the distributed optimizer's all-gather: the model's dtype, or with
    `fp8_param_gather` its transformer layers' share at `gathered_bytes` (the rank's total
    exact; its buckets each at the average)."""
    width = float(model.dtype_bytes)
    if not layout.fp8_param_gather:
        return width
    layers = rank_layers(model, layout, pp_rank)
    experts = sum(model.experts / layout.ep * expert_params(model) / layout.etp
                  for layer in layers if is_moe_layer(model, layer))
    te = model.layers_params(layers, layout.tp, layout.ep, layout.etp) - experts
    dense = model.params_on_stages(layout.stages_of_rank(pp_rank), layout.num_stages,
                                   layout.tp, layout.layers_of_rank(model, pp_rank),
                                   layers=layers, ep=layout.ep, etp=layout.etp) - experts
    return (te * gathered_bytes(model) + (dense - te) * width) / dense
