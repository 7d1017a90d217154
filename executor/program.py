"""A rank's plan lowered to runtime calls: what each op does, decided once, before any step.

`lower(plan, model, layout, rank)` maps every op to a `Call` — a typed value naming a
`RankRuntime` operation and its arguments (`executor.calls`) — by one `match` on the op's
purpose (`traces.purpose`), or raises ConfigError naming the op it cannot run, so a bad plan
fails before anything starts. Nothing here touches tensors; `executor.interpreter` binds the
calls to a runtime and runs them. Besides its purpose, an op gives its phase, layer,
micro-batch, stream and peer; the gradient buckets are sized by the plan's own `GradBucket`
ops of their first round (which must cut the flat order at unit boundaries), or, without
any, one per unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executor.calls import (
    Call,
    CeCollective,
    Compute,
    ComputeChunk,
    CpAttend,
    CpExchange,
    CpMessage,
    EmbeddingAllReduce,
    ExpertExchange,
    ExpertGather,
    ExpertGradReduce,
    GatherBucket,
    GatherReceived,
    GatherUnit,
    GradAccumulate,
    GradStatAllReduce,
    OptimizerStep,
    ReduceBucket,
    RoutingGather,
    SpAllReduce,
    StepKernel,
    TpChunkCollective,
    TpCollective,
    Transfer,
)
from executor.expert_fsdp import gathers_experts
from executor.experts import shards_experts
from executor.flat import Bucket, FlatLayout, sized_buckets, unit_buckets
from traces.chrome import event_name
from traces.errors import ConfigError
from traces.kernel_groups import GRAD_STORE_KERNELS, STEP_KERNELS
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Phase, Trace
from traces.purpose import (
    AmaxReduction,
    Bench,
    CpGather,
    CpRing,
    CrossEntropyStat,
    EmbeddingGrads,
    ExpertAllToAll,
    ExpertGrads,
    ExpertParamGather,
    ExpertTp,
    ExpertUnitGather,
    GemmChunk,
    GemmPart,
    GradBucket,
    GradStat,
    HostCopy,
    Kernel,
    KernelRun,
    MessageGather,
    ParamGather,
    PipeMessage,
    RoutingMapGather,
    SpGrads,
    TpChunk,
    TpSite,
    Unit,
    UnitGather,
    UnitGradReduce,
)

__all__ = ["Call", "RankProgram", "lower"]

_KERNEL_PHASES = (Phase.FWD, Phase.BWD, Phase.RECOMPUTE, Phase.WGRAD)
_GROUPED = (Kernel.EXPERT_FC1, Kernel.EXPERT_FC2)


@dataclass(frozen=True, slots=True)
class RankProgram:
    calls: tuple[Call, ...]
    buckets: list[Bucket]
    waits: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Ops that wait for more than the plan says, and for which: with tp_comm_overlap, the
    bulk input gradient of qkv and fc1 runs the kernel's whole backward (autograd computes a
    kernel's input and weight gradients in one call), so it waits for the all-gather the
    weight gradient reads."""


def lower(plan: Trace, model: ModelSpec, layout: Layout, rank: int) -> RankProgram:
    return _Lowering(plan.ops[rank], model, layout, rank).run()


class _Lowering:
    def __init__(self, ops: tuple[Op, ...], model: ModelSpec, layout: Layout, rank: int) -> None:
        self.ops, self.model, self.layout, self.rank = ops, model, layout, rank
        self.zero = layout.zero if layout.data_degree > 1 else 0
        self.flat = FlatLayout(model, layout, layout.coords(rank).pp)
        self.buckets = self._buckets()
        self.shards_experts = bool(model.experts) and shards_experts(layout, rank)
        self.gathers_experts = bool(model.experts) and gathers_experts(layout, rank)
        self.cp_steps: dict[tuple[Phase, int | None, int | None], int] = {}
        self.grouped: dict[tuple[Kernel, Phase | None, int | None, int | None], int] = {}
        """MoE: the grouped GEMMs' ops seen so far per kernel, pass, layer and micro-batch."""
        """Context parallelism: the attention core's steps seen so far per pass and layer."""

    def fail(self, index: int, rule: str) -> ConfigError:
        op = self.ops[index]
        return ConfigError(f"plan: rank {self.rank} op {index} ({event_name(op)}): {rule}")

    def run(self) -> RankProgram:
        return RankProgram(tuple(self._call(i, op) for i, op in enumerate(self.ops)),
                           self.buckets, self._waits())

    def _waits(self) -> dict[int, tuple[int, ...]]:
        """The bulk input gradients' extra wait (`RankProgram.waits`): for the saved input's
        all-gather of the same kernel, layer and micro-batch before it."""
        gathers: dict[tuple[Kernel, int | None, int | None], int] = {}
        out: dict[int, tuple[int, ...]] = {}
        for i, op in enumerate(self.ops):
            match op.purpose:
                case TpChunk(saved=True, kernel=kernel):
                    gathers[(kernel, op.layer, op.microbatch)] = i
                case GemmChunk(part=GemmPart.DGRAD, count=1, kernel=kernel):
                    found = gathers.get((kernel, op.layer, op.microbatch))
                    if found is None:
                        raise self.fail(i, "a bulk input gradient follows its input's gather")
                    out[i] = (found,)
        return out

    def _buckets(self) -> list[Bucket]:
        grads = [(op.purpose, op.size_bytes) for op in self.ops
                 if isinstance(op.purpose, GradBucket)]
        if self.zero == 3 or not grads:  # ZeRO-3, or dp = 1: one bucket per unit
            return unit_buckets(self.flat)
        first = min(bucket.round for bucket, _ in grads)
        sizes = sorted((bucket.index, size) for bucket, size in grads if bucket.round == first)
        return sized_buckets(self.flat, [size for _, size in sizes], self._grad_bytes())

    def _grad_bytes(self) -> int:
        return 4 if self.layout.fp32_main_grads else self.model.dtype_bytes

    # --- one op ----------------------------------------------------------------------------

    def _call(self, i: int, op: Op) -> Call:
        """The one interpretation of each purpose (a test enumerates them all)."""
        mb, stream = op.microbatch, op.stream
        self._check_kind(i, op)
        match op.purpose:
            case KernelRun(kernel=Kernel.OPTIMIZER):
                return OptimizerStep()
            case KernelRun(kernel=kernel) if kernel in GRAD_STORE_KERNELS:
                return GradAccumulate()
            case KernelRun(kernel=kernel) if kernel in STEP_KERNELS:
                return StepKernel(kernel)
            case GradStat(stat=stat):
                return GradStatAllReduce(stat, op.group, stream)
            case KernelRun(kernel=kernel):
                if op.phase not in _KERNEL_PHASES or mb is None:
                    raise self.fail(i, f"a kernel runs in phase fwd, bwd or recompute of a "
                                       f"micro-batch, not {op.phase}")
                if kernel is Kernel.FLASH_ATTN and self.layout.cp > 1:
                    return self._cp_step(i, op)
                part = 0
                if kernel in _GROUPED:  # one op per distinct token count (traces.moe)
                    key = (kernel, op.phase, op.layer, mb)
                    part = self.grouped[key] = self.grouped.get(key, -1) + 1
                return Compute(kernel, op.phase, op.layer, mb, part)  # type: ignore[arg-type]
            case CpRing(step=step, backward=backward):
                if op.peer is None or self.layout.cp == 1 or op.phase is None:
                    raise self.fail(i, "a CP ring message needs cp > 1, a peer and a phase")
                return CpMessage(op.kind is OpKind.SEND, step, backward, op.phase,
                                 self._layer(i, op), self._mb(i, mb), op.peer, op.tag)
            case CpGather(grad=grad):
                if self.layout.cp == 1 or op.phase is None:
                    raise self.fail(i, "a CP all-gather needs cp > 1 and a phase")
                return CpExchange(grad, op.phase, self._layer(i, op), self._mb(i, mb))
            case GemmChunk(kernel=kernel, part=part, index=index, count=count):
                if op.phase not in _KERNEL_PHASES or mb is None or not 0 <= index < count:
                    raise self.fail(i, "a GEMM chunk runs in phase fwd, bwd or recompute of a "
                                       "micro-batch, its index below its count")
                return ComputeChunk(kernel, op.phase, part, index, count, op.layer, mb)  # type: ignore[arg-type]
            case TpChunk() as chunk:
                if not self.layout.sp or not 0 <= chunk.index < chunk.count:
                    raise self.fail(i, "a TP chunk is sequence-parallel, its index below its "
                                       "count")
                return TpChunkCollective(chunk, op.layer, self._mb(i, mb), stream)
            case TpSite() as site:
                return TpCollective(site, op.layer, self._mb(i, mb))
            case MessageGather(tag=tag, boundary=boundary):
                if self.layout.sp or self.layout.tp == 1:
                    raise self.fail(i, "only a pipeline message received without SP under TP "
                                       "is all-gathered after its receive")
                return GatherReceived(boundary, self._mb(i, mb), tag)
            case CrossEntropyStat(stat=stat):
                return CeCollective(stat, self._mb(i, mb))
            case SpGrads(unit=unit):
                return SpAllReduce(self._unit(i, unit), stream)
            case EmbeddingGrads():
                return EmbeddingAllReduce()
            case GradBucket(index=index):
                return ReduceBucket(self._bucket(i, index), stream)
            case UnitGradReduce(unit=unit):
                return ReduceBucket(self._unit_bucket(i, unit), stream)
            case ParamGather(bucket=index):
                return GatherBucket(self._bucket(i, index), stream)
            case UnitGather(unit=unit):
                return GatherUnit(self._unit(i, unit), stream)
            case PipeMessage(tag=tag, boundary=boundary):
                if op.peer is None:
                    raise self.fail(i, "a send/recv needs a peer")
                return Transfer(op.kind is OpKind.SEND, boundary, self._mb(i, mb), tag,
                                op.peer)
            case AmaxReduction():
                raise self.fail(i, "FP8's amax reduction runs only in an fp8 run, which the "
                                   "executor refuses (executor.runtime.fp8_refusal)")
            case Bench():
                raise self.fail(i, "a microbenchmark op runs in executor.bench, not a plan")
            case ExpertAllToAll(step=step, grad=grad):
                if not self.model.experts or op.kind is not OpKind.ALL_TO_ALL:
                    raise self.fail(i, "an EP exchange is an all-to-all of an MoE model")
                return ExpertExchange(step, grad, self._layer(i, op), self._mb(i, mb), stream)
            case RoutingMapGather():
                if not self.model.experts or op.kind is not OpKind.ALL_GATHER:
                    raise self.fail(i, "a routing-map gather is an all-gather of an MoE model")
                return RoutingGather(self._layer(i, op))
            case ExpertGrads(unit=unit):
                sharded = self.shards_experts or self.gathers_experts
                kind = OpKind.REDUCE_SCATTER if sharded else OpKind.ALL_REDUCE
                if op.kind is not kind or unit.layer is None:
                    raise self.fail(i, f"the executor reduces a layer's expert gradients by "
                                       f"{kind} here (executor.experts.shards_experts)")
                return ExpertGradReduce(unit.layer, stream)
            case ExpertParamGather(unit=unit):
                if not self.shards_experts or unit.layer is None:
                    raise self.fail(i, "a layer's experts are gathered after the step only "
                                       "where ZeRO 1/2 shard them (executor.experts)")
                return ExpertGather(unit.layer, stream)
            case ExpertUnitGather(unit=unit):
                if not self.gathers_experts or unit.layer is None:
                    raise self.fail(i, "a layer's experts are gathered per use only under "
                                       "ZeRO 3 over an expert-DP group (executor.expert_fsdp)")
                return ExpertGather(unit.layer, stream)
            case HostCopy():
                raise self.fail(i, "activation offload copies are simulated, not run by the "
                                   "executor (executor.options.check_supported)")
            case ExpertTp():
                raise self.fail(i, "expert tensor parallelism (etp > 1) is not run by the "
                                   "executor (executor.options.check_supported)")
        raise self.fail(i, f"no interpretation of purpose {op.purpose!r}")

    def _check_kind(self, i: int, op: Op) -> None:
        """The op's kind is the one its purpose implies."""
        purpose = op.purpose
        if purpose is None:
            raise self.fail(i, "an op without a purpose (docs/plan-ops.md) cannot run")
        if isinstance(purpose, Bench | HostCopy):
            return  # refused by its arm
        if isinstance(purpose, KernelRun | GemmChunk) != (op.kind is OpKind.COMPUTE):
            raise self.fail(i, f"a {op.kind} op cannot be a {type(purpose).__name__}")
        if isinstance(purpose, PipeMessage | CpRing) != op.kind.is_p2p:
            raise self.fail(i, f"a {op.kind} op cannot be a {type(purpose).__name__}")
        if isinstance(purpose, TpSite | TpChunk) and purpose.kind is not op.kind:
            raise self.fail(i, f"a {op.kind} at a tensor-parallel site of a {purpose.kind}")

    def _cp_step(self, i: int, op: Op) -> CpAttend:
        """The attention core's ring step: its index among the pass's core ops, in order."""
        assert op.phase is not None
        key = (op.phase, op.layer, op.microbatch)
        step = self.cp_steps.get(key, 0)
        self.cp_steps[key] = step + 1
        return CpAttend(op.phase, self._layer(i, op), self._mb(i, op.microbatch), step)

    def _layer(self, i: int, op: Op) -> int:
        if op.layer is None:
            raise self.fail(i, "needs its layer")
        return op.layer

    def _mb(self, i: int, mb: int | None) -> int:
        if mb is None:
            raise self.fail(i, "needs its micro-batch")
        return mb

    def _bucket(self, i: int, index: int) -> int:
        if index >= len(self.buckets):
            raise self.fail(i, f"bucket {index}: the plan's first round defines "
                               f"{len(self.buckets)}")
        return index

    def _unit(self, i: int, unit: Unit) -> Unit:
        if unit not in self.flat.unit_range:
            raise self.fail(i, f"unit {unit} is not one of this rank's")
        return unit

    def _unit_bucket(self, i: int, unit: Unit) -> int:
        unit = self._unit(i, unit)
        return next(b.index for b in self.buckets if b.units == (unit,))
