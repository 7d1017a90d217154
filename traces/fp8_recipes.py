"""FP8 and FP4 scaling recipes: the casts, transposes and amax passes each launches around a
quantized GEMM.

`fp8_recipe` names (and `fp4_recipe`'s "nvfp4", with `dtype = "fp4"`), and what they stand for:

    delayed     Transformer Engine's DelayedScaling (Hopper's default): one fp32 scale per
                tensor from an amax history, known before the cast reads the tensor
    tensorwise  TE's Float8CurrentScaling and torchao's "tensorwise": one scale per tensor
                from the tensor's own amax, computed by a pass of its own first
    rowwise     torchao's "rowwise" (torchtitan's float8 recipe_name; the CUTLASS rowwise
                GEMM): one scale per row of each operand along the contracted dimension
    blockwise   TE's Float8BlockScaling, DeepSeek-V3's recipe (report §3.3): activations and
                gradients scaled per 1x128 block, weights per 128x128 block, fp32 scales
    mxfp8       TE's MXFP8BlockScaling (Blackwell): an E8M0 scale per 32 values
    nvfp4       TE's NVFP4BlockScaling (Blackwell; Megatron-Core's --fp4-format e2m1
                --fp4-recipe nvfp4): E2M1 values, half a byte each, an E4M3 scale per 16
                values and an fp32 scale per tensor (module section "NVFP4" below)

torchao's rowwise_with_gw_hp (the weight gradient GEMM in bf16) is not offered: a GEMM's
backward is one op at one rate here, its input and weight gradients alike.

Per linear Y = X·W on one micro-batch, a = M·K elements of X, w = K·N of W, c = M·N of dY,
n the elements of the norm before it. Hopper's FP8 tensor cores take only the "TN" layout, so
the weight gradient's Xᵀ and dYᵀ and the input gradient's Wᵀ are second copies: transposes of
the FP8 copy for per-tensor scales, quantized again from bf16 along the other axis for row and
1x128 scales (a 1-D block cannot be transposed; TE's fp8_blockwise_scaling docs); MXFP8's
columnwise copy is a second quantization too. Bytes (q: an FP8 value and its scale's share):

    delayed     fp8_cast     X: read 2a, write both copies 2a (TE's cast-transpose); after a
                             norm (qkv, fc1, MLA's q_up and kv_up: TE's LayerNormLinear) the
                             norm writes X in FP8 itself (n bytes, not 2n: TE's normalization
                             fuses the cast for a delayed-scaling quantizer) and fp8_cast is the
                             transpose, read a, write a
                fp8_cast_grad  dY: read 2c, write 2c
                weights      once a step: read 2w, write 2w; amax history all-reduced after
                             each stage pass (`traces.plan.fp8`)
    tensorwise  fp8_amax, fp8_cast       X: read 2a; then read 2a, write 2a (TE's
                             nvte_compute_amax, then its quantize: two reads, as TE's current
                             scaling docs say; TE runs the norm unfused for this recipe)
                fp8_amax, fp8_cast_grad  dY: read 2c; then read 2c, write 2c
                weights      once a step: read 2w for the amax, read 2w, write 2w
                with SP at tp > 1, a 4-byte fp32 all-reduce over TP between the amax and the
                cast of a column-parallel GEMM's gathered input (qkv, fc1) and of a
                row-parallel one's gathered output gradient (proj, fc2): TE's Linear sets
                with_amax_reduction on those quantizers (amax_reduction_group = the TP group);
                not MLA's latents, which Megatron-Core gathers itself (`traces.plan.fp8`)
    rowwise     forward      fp8_cast X and W along K (a row's amax and cast in one pass under
                             torch.compile): read 2a, write a; read 2w, write w
                backward     along the other axis, from bf16: fp8_amax then fp8_cast of X (2a;
                             2a, a) and of W (2w; 2w, w); dY along N (fp8_cast_grad 2c, c), and
                             along M (fp8_amax 2c, fp8_cast_grad 2c, c)
                torchao keeps no FP8 weight between micro-batches (no cast after the
                optimizer) and, per-row scales needing no agreement, no amax reduction
                (torchtitan gathers rowwise TP inputs in bf16)
    blockwise   fp8_cast     X: read 2a, write both 1x128 copies 2a(1 + 4/128) in one kernel
                             (TE quantizes rowwise and columnwise blocks from the bf16 source;
                             the norm runs unfused for block scaling)
                fp8_cast_grad  dY: read 2c, write 2c(1 + 4/128)
                weights      once a step: read 2w, write 2w(1 + 4/128²) (a 128x128 block's
                             scale serves both orientations); no amax reduction
    mxfp8       fp8_cast     X: read 2a, write both copies 2a(1 + 1/32) (TE's normalization
                             runs the norm unfused for MXFP8 unless NVTE_NORM_FWD_USE_CUDNN
                             selects cuDNN's fused kernel, which is not the default)
                fp8_cast_grad  dY: read 2c, write 2c(1 + 1/32)
                weights      once a step: read 2w, write 2w(1 + 1/32); no amax reduction

With SP at tp > 1, qkv's and fc1's input is gathered from the t ranks, and TE quantizes the
rank's shard before the gather for delayed, tensorwise, MXFP8 and NVFP4 (`sp_gather`;
`gathered_input_casts`): with a = the gathered elements, MXFP8's and NVFP4's casts above run
over a/t (both copies from the shard); delayed and tensorwise cast the shard row-wise only
(read 2a/t, write a/t; tensorwise's amax over 2a/t; a delayed norm writes it itself) and
transpose the gathered row-wise copy in backward (read a, write a), as TE's Linear computes
FP8 transposes after the backward gather. Blockwise (gathered in bf16) and rowwise keep their
casts over a. The output gradient's casts stay over the gathered c (not modelled: TE
quantizes dY's shard inside gather_along_first_dim).

Non-TN. Blackwell's FP8 GEMMs take every layout (TE's is_non_tn_fp8_gemm_supported(): compute
capability (10, 0) to below (12, 0), or 13 and up; transformer_engine/pytorch/utils.py), and
with a per-tensor scale the column-wise "copy" is then the row-wise data read transposed: TE's
Float8Quantizer and Float8CurrentScalingQuantizer allocate no transpose, with_transpose =
columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported() (NVIDIA/TransformerEngine@0064fbd
transformer_engine/pytorch/csrc/quantizer.cpp create_tensor, convert_and_update_tensor), so
nvte_quantize writes the row-wise copy alone; and Float8TensorStorage.update_usage
(columnwise_usage=True), which backward calls on SP's gathered input, makes no transpose there
(needs_data_transpose = False when is_non_tn_fp8_gemm_supported(): TransformerEngine@073d3fd
transformer_engine/pytorch/tensor/storage/float8_tensor_storage.py). Where the model runs there
(`ModelSpec.fp8_non_tn`, from the accelerator in `sim.config`), delayed and tensorwise casts
write one copy: X read 2a, write a (a delayed LayerNormLinear's norm writes it and no cast
runs); dY read 2c, write c; the weights read 2w, write w; no transpose of SP's gathered input
in backward. Block and row scales quantize their column-wise copies as above.

The GEMM reads X and dY at q_a and W at q_w bytes an element (rowwise's fp32 scale per row,
4/K bytes an element, is left out). Casts after an activation are not fused: Megatron-Core's
layer spec runs its own bias-GeLU / SwiGLU kernel and then TERowParallelLinear (TE fuses the
activation's cast only in its LayerNormMLP). Nor after ln1 with latent attention (TENorm, then
the TELinear down projections) or ln2 of an MoE layer (TENorm before the router).

GEMM rate: the per-tensor recipes, rowwise and blockwise run at the accelerator's FP8 dense
rate. No public measurement gives their GEMM rates apart from their casts on these accelerators:
torchao's H100 tables (float8 README) are of whole linears with their casts, as pictures;
DeepGEMM's up to 1,550 TFLOPS for 1x128/128x128 GEMMs on H800 (of 1,979 dense) is in line with
the per-tensor GEMMs' achieved fraction. MXFP8's block-scaled GEMMs run at `MXFP8_GEMM_RATE` of
that rate: TE's GEMM benchmark on a B300, its inputs quantized before the timed loop (GEMM
kernels alone, each GEMM of a layer of h 4096, ffn 16384, 15,872 tokens: Fprop, Dgrad and
Wgrad), took 7.161 ms a layer in MXFP8 against 6.812 ms with per-tensor current scaling
(NVIDIA/TransformerEngine@8f2e635 docs/examples/gemm_profiling/gemm_profiling.rst, "Autocast vs
Pre-quantized"). B200 and GB200 take the same ratio: Blackwell Ultra keeps Blackwell's FP8
tensor cores (`sim.models.rates`), so it is an assumption there, not a measurement.

NVFP4 (`dtype = "fp4"`; TE's NVFP4BlockScaling as its defaults set it, which Megatron-Core
builds for --fp4-recipe nvfp4 and Megatron-Bridge's bf16_with_nvfp4_mixed states: fp4 "e2m1",
fp4_recipe "nvfp4", fp8_param_gather False, training/mixed_precision.py; the performance scripts
take it unchanged for "nvfp4", scripts/performance/utils/precision.py get_precision_config
@84fba28, so every transformer layer's linears run in NVFP4, none kept in bf16). A value is an
E2M1 nibble (half a byte) with an E4M3 byte per 16 consecutive values and one fp32 per-tensor
scale (TE docs/features/low_precision_training/nvfp4/nvfp4.rst; NVIDIA, "Pretraining Large
Language Models with NVFP4", arXiv 2509.25149): q = 1/2 + 1/16 bytes a value (4.5 bits;
the fp32 per tensor left out). Weights take one scale per 16x16 block ("2D"), stored in the
same 1x16 scale layout (TE's NVFP4Quantizer::get_scale_shape does not depend on it), so their
q is the same. TE's recipe (transformer_engine/common/recipe/__init__.py NVFP4BlockScaling
__post_init__) applies the random Hadamard transform (RHT, a 16x16 Hadamard matrix times a
random sign per column, on 16-value blocks) to the column-wise copies of the input and the
output gradient, the wgrad GEMM's operands only ("RHT is currently only applied to column-wise
usage so that it can be used for wgrad GEMM"), stochastic rounding to the gradient's. The
scale per tensor needs the tensor's amax first, as current scaling does. TE's NVFP4Quantizer::
quantize_impl (transformer_engine/pytorch/csrc/quantizer.cpp, NVIDIA/TransformerEngine
@ad3f651) launches, for X and for dY:

    fp8_amax     nvte_hadamard_transform_amax: the amax of X and of RHT(Xᵀ) in one pass,
                 read 2a, RHT FLOPs 2·16·a
    fp8_cast     nvte_quantize_v2 of the row-wise copy: read 2a, write q·a
    fp8_cast     nvte_hadamard_transform_cast_fusion_columnwise, RHT and quantization of the
                 column-wise copy in one kernel: read 2a, write q·a, RHT FLOPs 2·16·a

(dY's under fp8_cast_grad, both its casts rounding stochastically: one 32-bit random word per 4
values, `SR_VALUES_PER_WORD`), and for the weight, once a step, nvte_compute_amax then one
nvte_quantize_v2 writing both copies: read 2w; read 2w, write 2q·w. The norm before qkv and fc1
runs unfused, writing bf16: TE's normalization (pytorch/csrc/extensions/normalization.cpp)
takes the unfused path for an NVFP4 quantizer with RHT ("Post-RHT amax is handled within NVFP4
quantizer"). Under SP at tp > 1 the amaxes of a gathered input or gradient are all-reduced over
TP before the cast (TE's nvfp4.rst "Distributed training"; quantize_impl's
with_amax_reduction), as current scaling's; the SP all-gathers then carry the NVFP4 data and
scales, q bytes an element (TE's distributed.py `_all_gather_nvfp4`;
`traces.plan.tensor`'s quantized gathers). The kernels keep
the FP8 casts' names: they are the same TE quantize calls on the same tensors. GEMM rate:
NVFP4's GEMMs run at `NVFP4_GEMM_RATE` of the accelerator's dense FP4 rate (`topology.presets`:
B200 9, GB200 10, B300 13.5, GB300 15 PF; `Accelerator.peak_flops_fp4`), from the same TE
benchmark as MXFP8's: pre-quantized, the layer's GEMMs took 3.764 ms in NVFP4 on the B300
against 6.812 ms with per-tensor FP8 (gemm_profiling.rst, "Autocast vs Pre-quantized"), where
the FP4 dense rate is 3x the FP8 one (DGX B300 data sheet: 108 PF FP4 dense, 72 PF FP8 with
sparsity, for 8 GPUs), so at per-tensor FP8's fraction of its peak they would have taken 6.812
/ 3 ms. GB300 is the same Blackwell Ultra chip; B200 and GB200, whose FP4 rate is 2x their FP8
one, take the same rate: an assumption there, not a measurement.

Where a recipe runs: mxfp8 and nvfp4 need Blackwell's hardware block scales (FP4 tensor
cores for nvfp4: `sim.config.check_fp8`); blockwise runs on Hopper
and on Blackwell (TE emulates it with MXFP8 there); tensorwise and rowwise wherever FP8 does.
TE's GroupedLinear refuses current scaling at TP > 1, so tensorwise with experts needs etp 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from traces.errors import ConfigError
from traces.kernel_work import KernelWork
from traces.purpose import Kernel

FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8")
"""`model.fp8_recipe` choices, each costed below: Transformer Engine's DelayedScaling,
Float8CurrentScaling (and torchao's tensorwise), torchao's rowwise, Float8BlockScaling
(DeepSeek-V3's 1x128 / 128x128 blocks) and MXFP8BlockScaling (Blackwell)."""

K = Kernel
BF16 = 2
BLOCK = 128
"""TE's Float8BlockScaling: 1x128 blocks for activations and gradients, 128x128 for weights,
an fp32 scale each (DeepSeek-V3 report §3.3)."""
MX_BLOCK = 32
"""MXFP8: one E8M0 scale byte per 32 consecutive values (OCP Microscaling spec, TE docs)."""
NV_BLOCK = 16
"""NVFP4: one E4M3 scale byte per 16 consecutive values (TE's nvfp4.rst, NVFP4_BLOCK_SIZE)."""
FP4 = 0.5
"""Bytes of an E2M1 value: two to a byte."""
HADAMARD = 16
"""The random Hadamard transform's size: each 16-value block times a 16x16 matrix, 2·16 FLOPs
a value (TE's hadamard_transform_cast_fusion.cu runs it as a bf16 GEMM of the tensor with the
16x16 matrix)."""
SR_VALUES_PER_WORD = 4
"""Stochastic rounding's values per 32-bit random word: TE's NVFP4 casts round with PTX
`cvt.rs.satfinite.e2m1x4.f32`, four values and one word of random bits an instruction
(transformer_engine/common/hadamard_transform/hadamard_transform_cast_fusion.cu,
StochasticNumericConverterBase), the words drawn from Philox."""
FP4_RECIPES = ("nvfp4",)
"""`model.fp4_recipe` choices: Megatron-Core's --fp4-recipe nvfp4 (TE's NVFP4BlockScaling)."""
B300_FP4_OVER_FP8 = 3
"""The B300's dense FP4 rate over its dense FP8 rate: DGX B300 data sheet, FP4 108 PF dense and
FP8 72 PF with sparsity (36 dense) for 8 GPUs."""
NVFP4_GEMM_RATE = 6.812 / B300_FP4_OVER_FP8 / 3.764
"""NVFP4 GEMMs' rate against the FP4 dense rate, at per-tensor FP8's fraction of the FP8 one:
one layer's GEMMs, pre-quantized, on B300 took 6.812 ms with current scaling and 3.764 ms in
NVFP4 (TE@8f2e635 gemm_profiling.rst), against 6.812 / 3 at the FP4 rate: 0.603."""
MXFP8_GEMM_RATE = 6.812 / 7.161
"""MXFP8 GEMMs' rate against per-tensor FP8's: one layer's GEMMs, pre-quantized, on B300 took
6.812 ms with current scaling and 7.161 ms in MXFP8 (TE@8f2e635 gemm_profiling.rst): 0.951."""


@dataclass(frozen=True, slots=True)
class Fp8Recipe:
    """What a recipe launches and moves (module docstring)."""

    name: str
    act_scale: float
    """Scale bytes per element of an FP8 activation or gradient copy."""
    weight_scale: float
    """Scale bytes per element of an FP8 weight copy."""
    norm_copies: int = 0
    """FP8 copies a LayerNormLinear's norm writes in place of its bf16 output (0: unfused;
    TE's normalization.cpp fuses the cast by default for delayed scaling only)."""
    amax_pass: bool = False
    """Current scaling: an amax kernel reads each tensor before its cast."""
    tp_amax: bool = False
    """With SP, the amax of a gathered input or gradient all-reduced over TP (TE)."""
    history: bool = False
    """Delayed scaling's amax history all-reduce after each stage pass."""
    per_use: bool = False
    """torchao: second copies quantized in backward from bf16, weights cast at every use."""
    block_hardware: bool = False
    """Needs hardware block scales (Blackwell)."""
    gemm_rate: float = 1.0
    """The GEMMs' rate as a fraction of the accelerator's dense rate in the recipe's format,
    FP8 or FP4 (module docstring)."""
    value_bytes: float = 1.0
    """Bytes of one quantized value: 1 for FP8, 1/2 for NVFP4's E2M1."""
    stochastic: bool = False
    """NVFP4: the output gradient's casts round stochastically, a random word per 4 values
    (`SR_VALUES_PER_WORD`), drawn as dropout's are (`sim.models.compute`)."""
    rht: bool = False
    """NVFP4: the column-wise copies of X and dY quantized apart, through the random Hadamard
    transform, after an amax pass that takes the transform's amax too (module docstring)."""
    sp_gather: bool = False
    """With SP at tp > 1, TE quantizes the sequence shard and all-gathers the quantized copy
    (`gathered_input_casts`; `traces.plan.tensor`'s quantized gathers)."""
    weight_per_forward: bool = False
    """torchao's tensorwise Float8Linear (`traces.fp8.recipe` under the eager and compiled
    stacks): each forward computes the weight's scale from its amax and casts it
    (Float8Linear.forward: get_weight_scale -> tensor_to_scale, then cast_weight_to_float8_t
    -> hp_tensor_and_scale_to_float8; pytorch/ao torchao/float8/float8_linear.py @024fe94),
    so a recomputed forward casts again; backward reuses the saved FP8 weight
    (manual_float8_matmul_with_args_in_float8 saves weight_fp8_t). Skipped only where FSDP's
    float8 all-gather hands it a Float8Tensor (enable_fsdp_float8_all_gather, off by default:
    torchtitan's --float8.enable_fsdp_float8_all_gather is a store_true flag, and its
    performance tables do not name it). No cast once a step (`weight_cast_per_element`)."""

    @property
    def q_act(self) -> float:
        return self.value_bytes + self.act_scale

    @property
    def q_weight(self) -> float:
        return self.value_bytes + self.weight_scale

    @property
    def transposes(self) -> bool:
        """The column-wise copy is the transpose of the FP8 row-wise one (one scale per
        tensor: delayed, tensorwise), not a quantization of its own."""
        return not self.per_use and self.act_scale == 0 and self.value_bytes == 1

    def copies(self, non_tn: bool) -> int:
        """FP8 copies a cast writes of a tensor the GEMMs read both ways: 2, but 1 for a
        per-tensor scale where the GEMMs take non-TN layouts (module section "Non-TN")."""
        return 1 if non_tn and self.transposes else 2

    @property
    def cast_kernels(self) -> int:
        """Kernels one quantization of a tensor launches: its cast, after an amax pass for
        current scaling, and NVFP4's second (Hadamard) cast."""
        return 1 + self.amax_pass + self.rht

    def weight_cast_per_element(self, non_tn: bool = False) -> float:
        """Bytes per weight element of the step's weight cast (0: cast at every use);
        `non_tn`: the GEMMs take non-TN layouts (`copies`)."""
        if self.per_use or self.weight_per_forward:
            return 0.0
        return BF16 * (2 if self.amax_pass else 1) + self.copies(non_tn) * self.q_weight


RECIPES = {r.name: r for r in (
    Fp8Recipe("delayed", 0.0, 0.0, norm_copies=1, history=True, sp_gather=True),
    Fp8Recipe("tensorwise", 0.0, 0.0, amax_pass=True, tp_amax=True, sp_gather=True),
    Fp8Recipe("rowwise", 0.0, 0.0, per_use=True),
    Fp8Recipe("blockwise", 4 / BLOCK, 4 / BLOCK**2),
    Fp8Recipe("mxfp8", 1 / MX_BLOCK, 1 / MX_BLOCK, block_hardware=True,
              gemm_rate=MXFP8_GEMM_RATE, sp_gather=True),
    Fp8Recipe("nvfp4", 1 / NV_BLOCK, 1 / NV_BLOCK, amax_pass=True, tp_amax=True,
              block_hardware=True, gemm_rate=NVFP4_GEMM_RATE, value_bytes=FP4, rht=True,
              stochastic=True, sp_gather=True),
)}


def fused_norm_bytes(recipe: Fp8Recipe, elements: float) -> float:
    """What a fused norm writes for its `elements` outputs, in place of their 2 bf16 bytes."""
    return recipe.norm_copies * recipe.q_act * elements


def input_casts(recipe: Fp8Recipe, a: float, w: float, fused: bool,
                non_tn: bool = False) -> list[KernelWork]:
    """The forward kernels before the GEMM, in order: X's (and torchao's W's) casts; `fused`:
    X comes from a LayerNormLinear's norm; `non_tn`: the GEMMs take non-TN layouts, so a
    per-tensor scale writes the row-wise copy only (module section "Non-TN")."""
    q = recipe.q_act
    if recipe.per_use:
        return [_fwd(K.FP8_CAST, BF16 * a + a), _fwd(K.FP8_CAST, BF16 * w + w)]
    if fused and recipe.norm_copies:  # the transpose of the norm's FP8 output, if any
        return [] if non_tn else [_fwd(K.FP8_CAST, 2 * q * a)]
    if recipe.rht:
        return _rht_casts(K.FP8_CAST, q, a, _fwd)
    cast = _fwd(K.FP8_CAST, (BF16 + recipe.copies(non_tn) * q) * a)
    return ([_fwd(K.FP8_AMAX, BF16 * a), cast] if recipe.amax_pass else [cast]) + \
        weight_casts(recipe, w)


def weight_casts(recipe: Fp8Recipe, w: float) -> list[KernelWork]:
    """torchao tensorwise's weight cast at each forward (`Fp8Recipe.weight_per_forward`): the
    amax pass over the bf16 weight (read 2w), then the cast (read 2w, write the row-wise FP8
    copy, q_w·w; its transpose is a view); none for other recipes."""
    if not recipe.weight_per_forward:
        return []
    return [_fwd(K.FP8_AMAX, BF16 * w), _fwd(K.FP8_CAST, (BF16 + recipe.q_weight) * w)]


def gathered_input_casts(recipe: Fp8Recipe, a: float, w: float, fused: bool, shard: int,
                         non_tn: bool = False) -> tuple[list[KernelWork], list[KernelWork]]:
    """X's casts where SP gathers X from `shard` ranks and TE quantizes before the gather
    (`recipe.sp_gather`): the forward kernels before the GEMM and the backward ones before its
    backward. TE's Linear and LayerNormLinear quantize the rank's a/shard rows, then call
    gather_along_first_dim(..., quantizer=input_quantizer). With block scales (MXFP8, NVFP4)
    both copies are quantized from the shard (input_quantizer.set_usage(rowwise=True,
    columnwise=backward_needs_input)), so every cast runs over a/shard. With a per-tensor
    scale (`recipe.transposes`) the quantizer "supports only rowwise all-gather": the shard is
    cast row-wise only (read 2a/shard, write q·a/shard; after an amax pass for current
    scaling; a delayed LayerNormLinear's norm writes it itself, `fused_norm`), and the
    transpose the weight gradient reads is made in backward from the row-wise copy gathered
    again (update_usage(columnwise_usage=True) on the gathered tensor): read q·a, write
    q·a; none where the GEMMs take non-TN layouts (`non_tn`, module section "Non-TN")."""
    local = a / shard
    if not recipe.transposes:
        return input_casts(recipe, local, w, fused), []
    transpose = [] if non_tn else [_bwd(K.FP8_CAST, 2 * recipe.q_act * a)]
    if fused and recipe.norm_copies:
        return [], transpose
    cast = _fwd(K.FP8_CAST, (BF16 + recipe.q_act) * local)
    casts = [_fwd(K.FP8_AMAX, BF16 * local), cast] if recipe.amax_pass else [cast]
    return casts + weight_casts(recipe, w), transpose


def backward_casts(recipe: Fp8Recipe, a: float, w: float, c: float,
                   non_tn: bool = False) -> list[KernelWork]:
    """The backward-only kernels after the GEMM in forward order (so, reversed, before its
    backward): dY's casts, and torchao's second copies of X and W; `non_tn`: a per-tensor
    scale writes dY's row-wise copy only (module section "Non-TN")."""
    if recipe.per_use:
        return [_bwd(K.FP8_CAST, BF16 * a + a), _bwd(K.FP8_AMAX, BF16 * a),
                _bwd(K.FP8_CAST, BF16 * w + w), _bwd(K.FP8_AMAX, BF16 * w),
                _bwd(K.FP8_CAST_GRAD, BF16 * c + c), _bwd(K.FP8_AMAX, BF16 * c),
                _bwd(K.FP8_CAST_GRAD, BF16 * c + c)]
    if recipe.rht:  # forward order: reversed, the amax runs first in backward
        draws = c / SR_VALUES_PER_WORD if recipe.stochastic else 0.0
        return list(reversed(_rht_casts(K.FP8_CAST_GRAD, recipe.q_act, c, _bwd, draws)))
    cast = _bwd(K.FP8_CAST_GRAD, (BF16 + recipe.copies(non_tn) * recipe.q_act) * c)
    return [cast, _bwd(K.FP8_AMAX, BF16 * c)] if recipe.amax_pass else [cast]


def _rht_casts(cast: Kernel, q: float, n: float, work: _Work,
               draws: float = 0.0) -> list[KernelWork]:
    """NVFP4's quantization of a bf16 tensor of `n` values, in the order TE runs it (module
    docstring): the amax with the Hadamard transform's, the row-wise cast, the column-wise
    Hadamard cast; `draws`: each cast's random words (stochastic rounding)."""
    rht = 2.0 * HADAMARD * n
    return [work(K.FP8_AMAX, BF16 * n, rht, 0.0), work(cast, (BF16 + q) * n, 0.0, draws),
            work(cast, (BF16 + q) * n, rht, draws)]


_Work = Callable[[Kernel, float, float, float], KernelWork]


def _fwd(name: Kernel, size: float, flops: float = 0.0, draws: float = 0.0) -> KernelWork:
    return KernelWork(name, flops, size, 0.0, 0.0, draws=draws)


def _bwd(name: Kernel, size: float, flops: float = 0.0, draws: float = 0.0) -> KernelWork:
    return KernelWork(name, 0.0, 0.0, flops, size, bwd_draws=draws)


def check_recipe_layout(recipe: str, experts: int, etp: int) -> None:
    """What a recipe cannot run with (module docstring): tensorwise experts at etp > 1."""
    if recipe == "tensorwise" and experts and etp > 1:
        raise ConfigError(f"parallel.etp: {etp} with model.fp8_recipe = \"tensorwise\": "
                          "Transformer Engine's GroupedLinear runs current scaling only at "
                          "expert TP 1 (its amaxes are not reduced over TP)")


def check_recipe_named(value: object, key: str = "fp8_recipe") -> None:
    """An `fp8_recipe` (or `fp4_recipe`) the config states is a recipe: "" is refused, not
    read as the key left out (which picks the accelerator's default, MXFP8 on Blackwell,
    delayed elsewhere; NVFP4 for fp4)."""
    if value == "":
        names = FP4_RECIPES if key == "fp4_recipe" else FP8_RECIPES
        raise ConfigError(f"model.{key}: \"\" is not one of {', '.join(names)}; leave "
                          "the key out for the accelerator's default")
