"""The runtime calls a plan lowers to: one frozen value per `RankRuntime` operation.

`executor.program` makes them (one per op, from its purpose); `executor.interpreter` binds
each to the runtime with one `match`.
"""

from __future__ import annotations

from dataclasses import dataclass

from traces.ops import Phase, Stream
from traces.purpose import (
    GemmPart,
    Kernel,
    MoeStep,
    Stat,
    StepStat,
    Tag,
    TpChunk,
    TpSite,
    Unit,
)


@dataclass(frozen=True, slots=True)
class Compute:
    kernel: Kernel
    phase: Phase
    layer: int | None
    mb: int
    part: int = 0
    """A grouped GEMM's later ops (one per distinct token count): the first runs it whole."""


@dataclass(frozen=True, slots=True)
class OptimizerStep:
    """The optimizer step over the rank's (shard of its) parameters."""


@dataclass(frozen=True, slots=True)
class StepKernel:
    """A kernel of the step's end before the optimizer: the norm, the clip, fp16's check."""

    kernel: Kernel


@dataclass(frozen=True, slots=True)
class GradAccumulate:
    """FSDP2's accumulation of a unit's gradients (`traces.fsdp_kernels`): the gradient store
    accumulates every backward's gradients itself, so nothing more runs. Also AsyncTP's sum of
    partial sums (`Kernel.TP_PARTIAL_SUM`): the reduce-scatter chunks already summed; and
    FSDP2's copy-out of a gathered unit (`Kernel.FSDP_COPY_OUT`): the gather wrote it."""


@dataclass(frozen=True, slots=True)
class GradStatAllReduce:
    """The all-reduce of a step statistic of the gradients over `group`."""

    stat: StepStat
    group: tuple[int, ...]
    stream: str


@dataclass(frozen=True, slots=True)
class TpCollective:
    site: TpSite
    layer: int | None
    mb: int


@dataclass(frozen=True, slots=True)
class ComputeChunk:
    """tp_comm_overlap: one chunk of one product of a GEMM kernel (`traces.purpose.GemmChunk`)."""

    kernel: Kernel
    phase: Phase
    part: GemmPart
    index: int
    count: int
    layer: int | None
    mb: int


@dataclass(frozen=True, slots=True)
class TpChunkCollective:
    """tp_comm_overlap: one chunk of a TP collective, asynchronous on its stream."""

    chunk: TpChunk
    layer: int | None
    mb: int
    stream: str


@dataclass(frozen=True, slots=True)
class CeCollective:
    stat: Stat
    mb: int


@dataclass(frozen=True, slots=True)
class GatherReceived:
    boundary: int
    mb: int
    tag: Tag


@dataclass(frozen=True, slots=True)
class SpAllReduce:
    unit: Unit
    stream: str


@dataclass(frozen=True, slots=True)
class EmbeddingAllReduce:
    """The tied word embeddings' gradient all-reduce between the first and last stages."""


@dataclass(frozen=True, slots=True)
class ReduceBucket:
    index: int
    stream: str


@dataclass(frozen=True, slots=True)
class GatherBucket:
    index: int
    stream: str


@dataclass(frozen=True, slots=True)
class GatherUnit:
    unit: Unit
    stream: str


@dataclass(frozen=True, slots=True)
class Transfer:
    """A pipeline send (`send`) or receive of the message at `boundary`."""

    send: bool
    boundary: int
    mb: int
    tag: Tag
    peer: int


@dataclass(frozen=True, slots=True)
class CpAttend:
    """Context parallelism: step `step` of a layer's attention core (p2p: one ring step;
    all_gather: the only one)."""

    phase: Phase
    layer: int
    mb: int
    step: int


@dataclass(frozen=True, slots=True)
class CpMessage:
    """A send (`send`) or receive of the CP ring's message `step`."""

    send: bool
    step: int
    backward: bool
    phase: Phase
    layer: int
    mb: int
    peer: int
    tag: str


@dataclass(frozen=True, slots=True)
class CpExchange:
    """all_gather CP: the K/V all-gather (`grad` false) or the dK/dV reduce-scatter."""

    grad: bool
    phase: Phase
    layer: int
    mb: int


@dataclass(frozen=True, slots=True)
class ExpertExchange:
    """MoE: a layer's dispatch or combine all-to-all over the EP group (`grad`: backward's)."""

    step: MoeStep
    grad: bool
    layer: int
    mb: int
    stream: str = Stream.COMPUTE
    """`ep_comm` with overlap_moe_comm: issued asynchronously."""


@dataclass(frozen=True, slots=True)
class RoutingGather:
    """MoE with HybridEP: a layer's routing map all-gathered over the EP group before its
    forward dispatch (`traces.purpose.RoutingMapGather`)."""

    layer: int


@dataclass(frozen=True, slots=True)
class ExpertGradReduce:
    """MoE: a layer's routed-expert gradients all-reduced over the expert-DP group."""

    layer: int
    stream: str


@dataclass(frozen=True, slots=True)
class ExpertGather:
    """MoE under ZeRO-1/2: a layer's updated routed-expert slices all-gathered over the
    expert-DP group (`traces.purpose.ExpertParamGather`)."""

    layer: int
    stream: str


Call = (Compute | StepKernel | GradAccumulate | GradStatAllReduce | OptimizerStep | TpCollective
        | CeCollective | GatherReceived | SpAllReduce | EmbeddingAllReduce | ReduceBucket
        | GatherBucket | GatherUnit | Transfer | CpAttend | CpMessage | CpExchange | ComputeChunk
        | TpChunkCollective | ExpertExchange | RoutingGather | ExpertGradReduce | ExpertGather)
CALLS: tuple[type, ...] = Call.__args__  # type: ignore[attr-defined]
