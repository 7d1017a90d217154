"""What each op of a plan is for: its kernel, its unit of parameters, and its purpose.

    Kernel          every kernel a plan runs (traces.kernels) and the optimizer step; every
                    kernel list in the project derives from it (LAYER_FLASH, CORE, ...);
                    its own module, `traces.kernel_names`, re-exported here
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

from traces.kernel_names import Kernel
from traces.kinds import OpKind


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


class StepStat(StrEnum):
    """A statistic of the whole step's gradients, all-reduced over the ranks holding distinct
    gradients (`traces.plan.optimizer.grad_stats_group`)."""

    FOUND_INF = "found_inf"
    """fp16: whether any gradient is inf or NaN (a max; the step is skipped if so)."""
    NORM = "norm"
    """The gradients' sum of squares (a sum), for clipping by the global norm."""


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


class GemmPart(StrEnum):
    """Which product of a GEMM kernel an op runs (`GemmChunk`)."""

    FPROP = "fprop"
    """The forward product (forward or recomputed)."""
    DGRAD = "dgrad"
    """Backward: the input gradient (M, K, N)."""
    WGRAD = "wgrad"
    """Backward: the weight gradient (K, N, M)."""


class OverlapMethod(StrEnum):
    """Transformer Engine's userbuffer overlap methods and torch's AsyncTP one
    (`traces.plan.overlap`)."""

    RING = "ring_exchange"
    """The all-gather as t - 1 exchanges, each beside the GEMM chunk of the shard before."""
    PIPELINE = "pipeline"
    """The GEMM in chunks, each chunk's reduce-scatter beside the next chunk's GEMM."""
    BULK = "bulk"
    """One whole collective beside one whole GEMM that does not need it."""
    PRODUCE = "produce_all2all"
    """torch's AsyncTP matmul + reduce-scatter (`_pipelined_produce_and_all2all`): t GEMM
    chunks, the first t - 1 each a peer's partial sum copied to it beside the next chunks
    (t - 1 copies; the rank's own partial, last, stays); two p2p buffers, so chunk k + 2
    waits for chunk k's copy."""


@dataclass(frozen=True, slots=True)
class GemmChunk:
    """With tp_comm_overlap: chunk `index` of `count` (along the tokens) of one product of a
    GEMM kernel, run while a TP collective's chunk (`TpChunk`) moves on the tp_comm stream."""

    kernel: Kernel
    part: GemmPart
    index: int
    count: int
    comm_sms: int
    """SMs the communication beside this chunk holds, which the GEMM does without (TE's
    num_sm with set_sm_margin; 0: none, or the copy engines move it): the interference
    model's hook."""


@dataclass(frozen=True, slots=True)
class TpChunk:
    """With tp_comm_overlap: chunk `index` of `count` of the TP collective at a site
    (`TpSite`'s fields), on the tp_comm stream beside the GEMM chunks (`GemmChunk`). Ring
    exchange: chunk k (1..t-1) all-gathers piece k - 1 of t - 1 of every rank's shard (chunk 0
    is the rank's own shard, no call): the bytes TE's step k copies from the ring neighbour,
    which the simulator lowers as that copy (`traces.plan.overlap.peer_copy`); pipeline:
    chunk k reduce-scatters piece k of n of
    every rank's block; produce: chunk k (of t - 1) reduce-scatters piece k of t - 1 of every
    rank's block, the bytes one copy of AsyncTP's delivers (one partial, lowered as that copy);
    bulk: one chunk, the whole collective."""

    kernel: Kernel
    slot: str
    grad: bool
    kind: OpKind
    saved: bool
    index: int
    count: int
    method: OverlapMethod

    @property
    def site(self) -> TpSite:
        return TpSite(self.kernel, self.slot, self.grad, self.kind, self.saved)


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
class GradStat:
    """The end of the step: the all-reduce of one `StepStat` of the gradients (Megatron-LM's
    clip_grad_norm_fp32 and found-inf check)."""

    stat: StepStat


@dataclass(frozen=True, slots=True)
class PipeMessage:
    """A pipeline send or receive: activations (tag act) or their gradients (grad) at stage
    `boundary`, the index of the layer whose input it is (a gradient of layer l's output is
    the gradient of layer l + 1's input)."""

    tag: Tag
    boundary: int


@dataclass(frozen=True, slots=True)
class AmaxReduction:
    """FP8 amaxes all-reduced (`traces.plan.fp8`): delayed scaling's of a stage pass over its TP,
    CP and DP ranks (fp8_autocast's end); current scaling's of one cast over TP (with SP)."""


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
class RoutingMapGather:
    """MoE with the HybridEP dispatcher (`dispatch = "hybridep"`): before each forward (and
    recomputed) dispatch, the all-gather of the rank's routing map (T tokens x E experts, one
    bool each) over its EP group, which HybridEP's metadata preprocessing reads
    (`traces.plan.experts`)."""


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
    group (all-reduce, or reduce-scatter under ZeRO 1/2), in the last micro-batch's backward;
    under ZeRO 3 a reduce-scatter after each backward of the layer, as its `UnitGradReduce`."""

    unit: Unit


@dataclass(frozen=True, slots=True)
class ExpertParamGather:
    """MoE under ZeRO 1/2: the all-gather of one layer's updated routed experts over the
    expert-data-parallel group after the optimizer step, the slices its `ExpertGrads`
    reduce-scatter handed each rank (Megatron-Core's distributed optimizer does so for its
    expert buffers as for the dense ones)."""

    unit: Unit


@dataclass(frozen=True, slots=True)
class ExpertUnitGather:
    """MoE under ZeRO 3 (FSDP with EP): the all-gather of one layer's routed experts over the
    expert-data-parallel group before its forward or backward, beside the `UnitGather` of the
    layer's dense parameters over DP (MoE Parallel Folding's FSDP+EP; `traces.plan.data`)."""

    unit: Unit


@dataclass(frozen=True, slots=True)
class HostCopy:
    """Activation CPU offloading (`traces.plan.offload`): one layer's stored activations of a
    micro-batch copied to host memory after its forward (`reload` False, stream `d2h`) or back
    before its backward (`reload` True, stream `h2d`), `size_bytes` over the host link."""

    unit: Unit
    reload: bool


@dataclass(frozen=True, slots=True)
class Bench:
    """An op of the microbenchmarks (traces.bench) that is not a plan kernel."""

    role: BenchRole


Purpose = (KernelRun | TpSite | MessageGather | CrossEntropyStat | SpGrads | GradBucket
           | UnitGather | UnitGradReduce | ParamGather | EmbeddingGrads | GradStat | PipeMessage
           | AmaxReduction | CpRing | CpGather | Bench | GemmChunk | TpChunk | ExpertAllToAll
           | RoutingMapGather | ExpertTp | ExpertGrads | ExpertParamGather | ExpertUnitGather
           | HostCopy)
PURPOSES: tuple[type, ...] = Purpose.__args__  # type: ignore[attr-defined]
"""Every purpose type (a test checks each has an interpretation)."""
