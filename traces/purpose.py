"""What each op of a plan is for: its kernel, its unit of parameters, and its purpose.

    Kernel          every kernel a plan runs (traces.kernels) and the optimizer step; every
                    kernel list in the project derives from it (LAYER_FLASH, CORE, ...)
    Unit            a unit of parameters: a layer, the embedding or the output layer
    Purpose         the union of the frozen values below; `Op.purpose` holds one (None for an
                    op imported from elsewhere, e.g. a PyTorch-profiler trace)

The pass that emits an op states its purpose once (`traces.plan`); the executor's lowering and
the layout search read it with one `match`; the op's `name` is a display label only.
docs/plan-ops.md lists where the plan puts each purpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from traces.kinds import OpKind


class Kernel(StrEnum):
    """The kernels of docs/plan-ops.md, in the order sim.profile lists them."""

    EMBED = "embed"
    POS_EMBED = "pos_embed"
    LN1 = "ln1"
    FP8_CAST = "fp8_cast"
    """An FP8 GEMM's input cast to FP8 with its second (transposed) copy (`traces.fp8`)."""
    QKV = "qkv"
    ROPE = "rope"
    """Rotary position embedding of q and k."""
    FLASH_ATTN = "flash_attn"
    QK = "qk"
    SOFTMAX = "softmax"
    ATTN_DROPOUT = "attn_dropout"
    AV = "av"
    PROJ = "proj"
    BDA1 = "bda1"
    LN2 = "ln2"
    FC1 = "fc1"
    GELU = "gelu"
    SWIGLU = "swiglu"
    """SwiGLU's gated activation, silu(gate)·up."""
    FC2 = "fc2"
    ROUTER = "router"
    """MoE: the router's logits GEMM (`traces.moe`)."""
    TOPK = "topk"
    """MoE: softmax over the experts and the top-k pick."""
    AUX_LOSS = "aux_loss"
    """MoE: the load-balancing loss over the router's scores."""
    PERMUTE = "permute"
    """MoE: tokens copied into expert order (one row per kept assignment)."""
    EXPERT_FC1 = "expert_fc1"
    """MoE: the routed experts' fc1 as grouped GEMMs (M = tokens an expert got)."""
    EXPERT_ACT = "expert_act"
    EXPERT_FC2 = "expert_fc2"
    UNPERMUTE = "unpermute"
    """MoE: the experts' outputs weighted by their probabilities back into token order."""
    FP8_CAST_GRAD = "fp8_cast_grad"
    """An FP8 GEMM's output gradient cast to FP8 with its second copy (backward only)."""
    BDA2 = "bda2"
    FINAL_LN = "final_ln"
    LOGITS = "logits"
    CROSS_ENTROPY = "cross_entropy"
    OPTIMIZER = "optimizer"
    FP8_WEIGHT_CAST = "fp8_weight_cast"
    """The step's cast of the FP8 GEMMs' weights, after the optimizer."""


K = Kernel
FLASH_CORE = (K.FLASH_ATTN,)
UNFUSED_CORE = (K.QK, K.SOFTMAX, K.ATTN_DROPOUT, K.AV)
MOE = (K.ROUTER, K.TOPK, K.AUX_LOSS, K.PERMUTE, K.EXPERT_FC1, K.EXPERT_ACT, K.EXPERT_FC2,
       K.UNPERMUTE)
ATTENTION_CORE: dict[str, tuple[Kernel, ...]] = {"flash": FLASH_CORE, "unfused": UNFUSED_CORE}
"""The attention core per `ModelSpec.attention` (what selective recomputation re-runs)."""


FP8_KERNELS = frozenset({K.FP8_CAST, K.FP8_CAST_GRAD, K.FP8_WEIGHT_CAST})
"""The kernels only an FP8 model runs (the executor runs none: FP8 is GPU-only)."""


def layer_kernels(attention: str, *, rope: bool = False, ffn: str = "gelu"
                  ) -> tuple[Kernel, ...]:
    """One layer's kernels in forward order (without FP8's casts)."""
    return (K.LN1, K.QKV, *((K.ROPE,) if rope else ()), *ATTENTION_CORE[attention], K.PROJ,
            K.BDA1, K.LN2, K.FC1, K.SWIGLU if ffn == "swiglu" else K.GELU, K.FC2, K.BDA2)


LAYER_FLASH = layer_kernels("flash")
LAYER_UNFUSED = layer_kernels("unfused")
CORE_KERNELS = frozenset(FLASH_CORE + UNFUSED_CORE)
LAYER_KERNELS = frozenset(LAYER_FLASH + LAYER_UNFUSED) | {K.ROPE, K.SWIGLU, K.FP8_CAST, *MOE,
                                                           K.FP8_CAST_GRAD}
FIRST_STAGE = (K.EMBED, K.POS_EMBED)
"""The embedding's kernels, forward order (first virtual stage)."""
LAST_STAGE = (K.FINAL_LN, K.LOGITS, K.CROSS_ENTROPY)
"""The output layer's kernels, forward order (last virtual stage)."""
KERNEL_NAMES = tuple(str(k) for k in Kernel)


class Part(StrEnum):
    LAYER = "layer"
    EMBED = "embed"
    HEAD = "head"


@dataclass(frozen=True, slots=True)
class Unit:
    """A unit of parameters (docs/plan-ops.md): a layer (`layer` its index), the embedding
    (word embeddings and positions) or the output layer (`head`: the final norm and the
    output weights). ZeRO-3 gathers and reduces unit by unit; buckets cut units in order."""

    part: Part
    layer: int | None = None

    def __post_init__(self) -> None:
        assert (self.layer is not None) == (self.part is Part.LAYER), self

    @staticmethod
    def of_layer(layer: int) -> Unit:
        return Unit(Part.LAYER, layer)

    def __str__(self) -> str:
        return f"L{self.layer}" if self.part is Part.LAYER else str(self.part)


EMBED = Unit(Part.EMBED)
HEAD = Unit(Part.HEAD)


class Tag(StrEnum):
    """What a pipeline message carries (also the p2p op's `tag`)."""

    ACT = "act"
    GRAD = "grad"


class Stat(StrEnum):
    """The vocab-parallel cross-entropy's statistics, all-reduced over TP."""

    MAX = "max"
    """The max of each token's logits (after `logits`)."""
    SUM = "sum"
    """The target logit and the sum of exponentials (after `cross_entropy`)."""


class BenchRole(StrEnum):
    """The ops of the microbenchmarks (`traces.bench`) besides the probes' plan kernels."""

    CALL = "call"
    """A swept collective or transfer."""
    GAP = "gap"
    """The kernel before each swept call."""
    PROBE_ALONE = "probe_alone"
    PROBE_OVERLAPPED = "probe_overlapped"
    SPACER = "spacer"
    COLLECTIVE_BESIDE = "collective_beside"
    """The interference collective with a chain of probes beside it."""
    COLLECTIVE_ALONE = "collective_alone"


@dataclass(frozen=True, slots=True)
class KernelRun:
    """A compute op: one kernel (forward, backward or recomputed), or the optimizer step."""

    kernel: Kernel


@dataclass(frozen=True, slots=True)
class TpSite:
    """A tensor-parallel collective at one of Megatron-LM's f/g sites (traces.plan.tensor)."""

    kernel: Kernel
    """The kernel whose slot it is (its scope and layer place the slot)."""
    slot: str
    """The kernel's input or output it acts on (executor.kernels' slot names)."""
    grad: bool
    """The slot's gradient (backward) rather than its value."""
    kind: OpKind
    saved: bool = False
    """An all-gather of the sequence shard the kernel's forward kept, for its backward."""


@dataclass(frozen=True, slots=True)
class MessageGather:
    """Without SP under TP: the all-gather of a received pipeline message's TP chunks."""

    tag: Tag
    boundary: int


@dataclass(frozen=True, slots=True)
class CrossEntropyStat:
    stat: Stat


@dataclass(frozen=True, slots=True)
class SpGrads:
    """With SP: the TP all-reduce of a unit's replicated parameters' partial gradients."""

    unit: Unit


@dataclass(frozen=True, slots=True)
class GradBucket:
    """A DP reduction of gradient bucket `index` (ZeRO 0-2) in the backward of micro-batch
    `round` (ZeRO 0/1: the last; ZeRO 2: each)."""

    index: int
    round: int


@dataclass(frozen=True, slots=True)
class UnitGather:
    """ZeRO-3: the all-gather of one unit's parameters before its forward or backward."""

    unit: Unit


@dataclass(frozen=True, slots=True)
class UnitGradReduce:
    """ZeRO-3: the reduce-scatter of one unit's gradients after its backward."""

    unit: Unit


@dataclass(frozen=True, slots=True)
class ParamGather:
    """ZeRO-1/2: the all-gather of gradient bucket `bucket`'s updated parameters."""

    bucket: int


@dataclass(frozen=True, slots=True)
class EmbeddingGrads:
    """Tied embeddings with pp > 1: the first and last stages' word-embedding gradients."""


@dataclass(frozen=True, slots=True)
class PipeMessage:
    """A pipeline send or receive: activations (tag act) or their gradients (grad) at stage
    `boundary`, the index of the layer whose input it is (a gradient of layer l's output is
    the gradient of layer l + 1's input)."""

    tag: Tag
    boundary: int


@dataclass(frozen=True, slots=True)
class AmaxReduction:
    """FP8 delayed scaling: the all-reduce of a stage pass's amaxes over the stage's TP, CP and
    DP ranks (Transformer Engine at the end of fp8_autocast; `traces.plan.fp8`)."""


@dataclass(frozen=True, slots=True)
class CpRing:
    """Context parallelism, cp_comm = "p2p": message `step` of a layer's ring
    (traces.plan.context). Forward (`backward` false): the K/V block the rank holds, sent on
    to the next CP rank while attention runs on it. Backward: the K/V block and the dK/dV
    accumulated for it so far, sent to the previous CP rank (step 0: K/V only; the last
    step: dK/dV only), as Transformer Engine's AttnFuncWithCPAndKVP2P."""

    step: int
    backward: bool


@dataclass(frozen=True, slots=True)
class CpGather:
    """Context parallelism, cp_comm = "all_gather": the all-gather of K/V over the CP group
    before attention (`grad` false; forward, and again in backward), or the reduce-scatter
    of dK/dV after attention's backward (`grad` true), as Transformer Engine's
    AttnFuncWithCPAndKVAllGather (the Llama 3 paper's all-gather CP)."""

    grad: bool


class MoeStep(StrEnum):
    """Which of an MoE layer's two exchanges (traces.plan.experts)."""

    DISPATCH = "dispatch"
    """Tokens to the EP ranks holding their experts (after permute)."""
    COMBINE = "combine"
    """The experts' outputs back to the tokens' ranks (after expert_fc2)."""


@dataclass(frozen=True, slots=True)
class ExpertAllToAll:
    """MoE with EP > 1: a layer's dispatch or combine all-to-all over its EP group; `grad`:
    the same exchange of the gradients, reversed, in backward."""

    step: MoeStep
    grad: bool


@dataclass(frozen=True, slots=True)
class ExpertTp:
    """MoE with ETP > 1: after the dispatch, the all-gather of the received tokens over the
    ETP group (`step` dispatch), and before the combine the reduce-scatter of the experts'
    partial outputs (`step` combine); `grad`: their backward counterparts."""

    step: MoeStep
    grad: bool


@dataclass(frozen=True, slots=True)
class ExpertGrads:
    """MoE: the reduction of one layer's routed-expert gradients over the expert-data-parallel
    group (all-reduce, or reduce-scatter under ZeRO 1/2), in the last micro-batch's backward."""

    unit: Unit


@dataclass(frozen=True, slots=True)
class Bench:
    """An op of the microbenchmarks (traces.bench) that is not a plan kernel."""

    role: BenchRole


Purpose = (KernelRun | TpSite | MessageGather | CrossEntropyStat | SpGrads | GradBucket
           | UnitGather | UnitGradReduce | ParamGather | EmbeddingGrads | PipeMessage
           | AmaxReduction | CpRing | CpGather | ExpertAllToAll | ExpertTp | ExpertGrads
           | Bench)
PURPOSES: tuple[type, ...] = Purpose.__args__  # type: ignore[attr-defined]
"""Every purpose type (a test checks each has an interpretation)."""
