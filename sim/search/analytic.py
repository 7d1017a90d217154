"""The analytic tier of `parasim search`: a layout's step time and memory in closed form.

It shares its parts with the simulator rather than being a second model of the step: the plan
builder's own ops for one layer, the embedding and the output layer (`sim.search.passes`), each
kernel timed by `ComputeModel`, each collective lowered by `Collectives.resolve` and timed
alone by its alpha-beta time, memory by `pp_rank_memory`. The step is the closed-form 1F1B
pipeline (the bubble (p-1)/(v·m)) plus what the end of the step exposes, with kernels slowed
where communication runs beside them and stretched by the fleet's variability, as the replay
does; it leaves out contention and the exact overlap the full simulation adds. Context
parallelism's all-gathers are timed as the inline collectives they are; of its p2p ring, what
each message takes beyond the attention step beside it. An uneven pipeline's end ranks run
their own layer counts; its bubble stays the even one's. Where a rank's chunks differ
(Megatron-Core's account flags with vp > 1, a pipeline layout), every rank adds up its own
chunks and the largest chunk sets the bubble (`sim.search.rank_work`).

The derivation in full: docs/search-analytic.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import groupby

from sim.collectives import Algorithm, Collectives, analytic_time
from sim.collectives.direct import EXCHANGE
from sim.config import resolve_non_tn
from sim.engine.transport import NetworkMode
from sim.models.activation_memory import combined_1f1b
from sim.models.compute import ComputeModel
from sim.models.host import device_cast_launches, device_launches
from sim.models.interference import Interference
from sim.models.memory import MemoryBreakdown, peak_in_flight, pp_rank_memory
from sim.models.moe_memory import rank_layers
from sim.models.sharing import interference_for
from sim.models.variability import step_stretch
from sim.profile import Profile
from sim.search.passes import (
    PassKey,
    PassOps,
    Placed,
    UnitOps,
    grad_bytes,
    gradient_buckets,
    pass_ops,
)
from sim.search.rank_work import equal_chunks, pipe_work
from sim.search.stage_time import UnitTime, beside
from topology.cluster import Cluster
from traces.alltoallv import AllToAllv
from traces.expert_grid import ep_group, etp_group, expert_data_group
from traces.fp8_params import param_gather_bytes
from traces.layout import Axis, Layout, Schedule
from traces.model import ModelSpec
from traces.moe_spec import is_moe_layer
from traces.ops import Op, OpKind, Phase
from traces.pipeline import (
    Action,
    ActionSchedule,
    build_schedule,
    gpipe,
    interleaved,
    one_f_one_b,
)
from traces.plan.optimizer import grad_stats_group
from traces.plan.overlap import in_region, peer_copy, region_seconds
from traces.purpose import Kernel, KernelRun
from traces.stack import launch_counts
from traces.zero_bubble import zb1p


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """The analytic tier's verdict on one layout."""

    step_time_s: float
    compute_s: float
    """Kernel time of the busiest pipeline rank (recomputation and optimizer included)."""
    bubble_s: float
    """The closed-form pipeline bubble, (p-1)·t_vs."""
    exposed_comm_s: float
    """The rest of the step: TP/SP collectives, sends, exposed DP/ZeRO communication."""
    peak_memory_bytes: float
    fits: bool


class Analytic:
    """Closed-form estimates of layouts of one model on one cluster (see the module
    docstring); caches what layouts share, so screening thousands costs seconds."""

    def __init__(self, model: ModelSpec, cluster: Cluster, profile: Profile, *,
                 network: NetworkMode = NetworkMode.FLOW,
                 algo: Algorithm = Algorithm.AUTO) -> None:
        self.model, self.cluster = resolve_non_tn(model, cluster.accelerator), cluster
        self.profile = profile
        self._computes: dict[int, tuple[ComputeModel, Interference]] = {}
        self.compute, self.interference = self._timing(launch_counts(model), 0)
        self.variability = cluster.variability
        self.collectives = Collectives(cluster)
        self._domain = cluster.devices_per_server  # sizes HybridEP's buffers
        self._non_tn = cluster.accelerator.fp8_block_scaling  # TE's FP8 weight copies
        self.free_network = network == NetworkMode.IDEAL
        self.algo = algo
        self._passes: dict[PassKey, PassOps] = {}
        self._units: dict[tuple[PassKey, int, int, int, float],
                          tuple[UnitTime, UnitTime, UnitTime]] = {}
        self._comm: dict[tuple[OpKind, tuple[int, ...], float, AllToAllv | None], float] = {}
        self._peaks: dict[tuple[Schedule, int, int, int, int], tuple[int, ...]] = {}
        self._groups: dict[tuple[int | str | bool, ...], tuple[int, ...]] = {}
        self._bucket_sizes: dict[tuple[int | str, ...], list[float]] = {}

    def _timing(self, launches: Mapping[tuple[str, bool], int] | None, casts: int
                ) -> tuple[ComputeModel, Interference]:
        """The compute model with these device launches, and its interference; built once
        per `casts` (the expert cast op's kernels, `_of`)."""
        found = self._computes.get(casts)
        if found is None:
            compute = ComputeModel.of_model(self.cluster.accelerator, self.profile,
                                            self.model, launches)
            found = self._computes[casts] = (
                compute, interference_for(self.cluster, self.profile, compute))
        return found

    def _of(self, layout: Layout) -> tuple[ComputeModel, Interference]:
        """The compute model and interference of `layout`'s ranks: under Transformer Engine's
        GroupedLinear (`traces.moe_spec.gemm_streams` > 0) an FP8 expert cast op launches a
        quantize per local expert, so its launches follow ep (`sim.models.host.device_launches`,
        as the simulator charges them)."""
        casts = device_cast_launches(self.model, layout)
        if casts <= 1:
            return self.compute, self.interference
        return self._timing(device_launches(self.model, layout), casts)

    # --- the estimate --------------------------------------------------------------------------

    def estimate(self, layout: Layout) -> Estimate:
        """Step time and peak memory of `layout` (valid for this model and cluster)."""
        ops = self.pass_ops(layout)
        stretch = step_stretch(self.variability, layout, self.cluster.devices_per_server)
        layer, first, last = self._unit_times(layout, ops, stretch)
        p, m = layout.pp, layout.num_microbatches
        # A pipeline hop: the send, and what the receiver runs on the data first.
        hop = self._send(layout, ops.send_bytes) + sum(
            self._op_time(layout, op, axis) for op, axis in ops.after_receive)
        work = pipe_work(self.model, layout, layer, first, last, hop)
        chunk, ranks = work.chunk, sorted(work.ranks)
        t_vs = chunk.fwd + chunk.bwd + (2 * hop if p > 1 else 0.0)
        bubble = (p - 1) * t_vs
        per_microbatch = {r: w.per_microbatch for r, w in work.ranks.items()}
        # ZeRO-3: nothing hides the step's first gathers (the embedding's and the first
        # layer's) before the first kernel can run.
        start = max(first.side_fwd + layer.side_fwd - first.compute_fwd, 0.0) \
            if first.side_fwd else 0.0
        pipe = start + m * max(per_microbatch.values()) + bubble
        step, compute = 0.0, 0.0
        # How much longer a backward's kernels take beside communication (the DP reductions
        # that overlap it): a layer's.
        slowed = layer.beside_bwd / layer.compute_bwd if layer.compute_bwd else 1.0
        for r in ranks:
            end, optimizer = self._end_of_step(layout, ops, r, work.ranks[r].last_backward,
                                               per_microbatch[r], slowed, stretch)
            # Rank r's last backward ends r stages before rank 0's; what the last unit of it
            # leaves on the side streams (the embedding's on rank 0, else a layer's) follows.
            finished = pipe - r * (chunk.bwd + hop)
            step = max(step, finished + work.ranks[r].tail + end)
            compute = max(compute, m * work.ranks[r].kernels + optimizer)
        peak = self.peak_memory(layout)
        return Estimate(step_time_s=step, compute_s=compute, bubble_s=bubble,
                        exposed_comm_s=max(step - compute - bubble, 0.0),
                        peak_memory_bytes=peak,
                        fits=peak <= self.cluster.accelerator.memory_bytes)

    def _end_of_step(self, layout: Layout, ops: PassOps, r: int, last_backward: float,
                     microbatch: float, slowed: float = 1.0,
                     stretch: float = 1.0) -> tuple[float, float]:
        """(seconds rank r spends after its last backward, of which the step end's kernels):
        exposed gradient reduction, tied-embedding all-reduce, the norm, its all-reduce, the
        clip, the optimizer, parameter gather. The reductions that overlap compute slow its
        kernels `slowed` times (`beside`); what that adds to the compute ends later. Kernels
        take `stretch` times as long (the fleet's variability)."""
        params = self.model.params_on_stages(layout.stages_of_rank(r), layout.num_stages,
                                             layout.tp, layout.layers_of_rank(self.model, r))
        shard = layout.data_degree if layout.zero >= 1 else 1
        optimizer = sum(self.compute.kernel_time(kernel, 0.0, params / shard * per_param)
                        * stretch for kernel, per_param in ops.step_kernels)
        end = optimizer + sum(self._collective(OpKind.ALL_REDUCE,
                                               self.group(layout, "grad_stats"), size)
                              for size in ops.step_stats)
        if ops.expert_gather:  # each MoE layer's updated experts, over expert-DP
            moe = sum(is_moe_layer(self.model, layer)
                      for layer in rank_layers(self.model, layout, r))
            end += moe * self._collective(OpKind.ALL_GATHER, self.group(layout, "edp"),
                                          ops.expert_gather)
        if ops.embedding_grads is not None and r in (0, layout.pp - 1):
            end += self._collective(OpKind.ALL_REDUCE, self.group(layout, "embedding"),
                                    ops.embedding_grads)
        if ops.grad_reduction is None:
            return end, optimizer
        buckets = self.buckets(layout, r)
        dp = self.group(layout, "dp")
        reductions = [self._collective(ops.grad_reduction, dp, b) for b in buckets]
        reduce = sum(reductions)
        m = layout.num_microbatches
        times = m if ops.reduce_every_microbatch else 1
        if layout.overlap_grad_reduce:
            window = last_backward * times
            tail = reductions[-1]
        else:  # after each reducing backward: ZeRO-2's run while later micro-batches compute
            window = (m - 1) * microbatch if ops.reduce_every_microbatch else 0.0
            tail = reduce
        # All but the tail run beside compute, whose kernels they slow.
        later = beside(window, window * slowed, max(times * reduce - tail, 0.0)) - window
        end += later + max(times * reduce - window - later, tail)
        if ops.gather_after_optimizer:  # the same slices, as parameters
            to_params = param_gather_bytes(self.model, layout, r) / grad_bytes(self.model, layout)
            end += sum(self._collective(OpKind.ALL_GATHER, dp, b * to_params) for b in buckets)
        return end, optimizer

    # --- memory --------------------------------------------------------------------------------

    def memory(self, layout: Layout) -> list[MemoryBreakdown]:
        """`sim.models.memory.memory_by_pp_rank`, with each rank's peak of micro-batches in flight
        taken once per distinct schedule."""
        return [pp_rank_memory(self.model, layout, r, self._holding(layout, r), self._domain,
                               self._non_tn) for r in range(layout.pp)]

    def peak_memory(self, layout: Layout) -> float:
        """The largest of `memory(layout)`'s totals, from the ranks that can hold it: the
        first, the last, and the middle one with the most micro-batches in flight (middle
        ranks hold the same parameters and buffers)."""
        peaks = self._in_flight(layout)
        ranks = {0, layout.pp - 1}
        if not equal_chunks(self.model, layout):  # chunks differ: each rank's own peak
            ranks = set(range(layout.pp))
        elif layout.pp > 2:
            ranks.add(max(range(1, layout.pp - 1), key=lambda r: (peaks[r], -r)))
        return max(pp_rank_memory(self.model, layout, r, self._holding(layout, r),
                                  self._domain, self._non_tn).total_bytes
                   for r in sorted(ranks))

    def _holding(self, layout: Layout, r: int) -> list[Action]:
        """What `pp_rank_memory` needs of rank r's schedule: its peak in flight where its
        chunks are equal; its actions where they differ (which chunks are in flight counts)
        or where Megatron-Core's combined 1F1B pairs them (which actions pair counts:
        `sim.models.activation_memory.paired_levels`)."""
        if equal_chunks(self.model, layout) and not combined_1f1b(layout):
            return _holding(self._in_flight(layout)[r])
        key = (layout.schedule, layout.pp, layout.num_microbatches, layout.vp,
               int(layout.overlap_moe_comm))
        return _GENERATORS[key[0]](*key[1:])[r]

    def _in_flight(self, layout: Layout) -> tuple[int, ...]:
        """Micro-batches each pipeline rank holds at its peak under the layout's schedule."""
        key = (layout.schedule, layout.pp, layout.num_microbatches, layout.vp,
               int(layout.overlap_moe_comm))
        peaks = self._peaks.get(key)
        if peaks is None:
            schedule = _GENERATORS[key[0]](*key[1:])
            peaks = self._peaks[key] = tuple(peak_in_flight(schedule[r]) for r in range(key[1]))
        return peaks

    def buckets(self, layout: Layout, r: int) -> list[float]:
        """Bytes of each gradient bucket pipeline rank r reduces (cached)."""
        key = (layout.tp, layout.pp, layout.vp, r, layout.fp32_main_grads, layout.bucket_bytes,
               layout.pp_first_layers, layout.pp_last_layers, layout.account_for_embedding,
               layout.account_for_loss, layout.pipeline_layout)
        found = self._bucket_sizes.get(key)
        if found is None:
            found = self._bucket_sizes[key] = gradient_buckets(self.model, layout, r)
        return found

    def group(self, layout: Layout, axis: str) -> tuple[int, ...]:
        """Rank 0's group along `axis` (every group along it has the same shape)."""
        key = (layout.tp, layout.cp, layout.pp, layout.dp, layout.ep, layout.etp,
               layout.zero >= 1 and axis == "grad_stats", axis)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = (
                layout.embedding_group(0) if axis == "embedding" else
                grad_stats_group(layout, 0) if axis == "grad_stats" else
                layout.data_group(0) if axis == "dp" else
                _EXPERT_GROUPS[axis](layout, 0) if axis in _EXPERT_GROUPS else
                layout.group(0, Axis(axis)))
        return group

    # --- costs of ops --------------------------------------------------------------------------

    def pass_ops(self, layout: Layout) -> PassOps:
        """`sim.search.passes.pass_ops` of the layout, built once per `PassKey`."""
        key = PassKey.of(layout)
        found = self._passes.get(key)
        if found is None:
            found = self._passes[key] = pass_ops(self.model, layout)
        return found

    def _unit_times(self, layout: Layout, ops: PassOps,
                    stretch: float = 1.0) -> tuple[UnitTime, UnitTime, UnitTime]:
        key = (PassKey.of(layout), layout.tp, layout.cp, layout.dp, stretch)
        found = self._units.get(key)
        if found is None:
            layer = self._unit(layout, ops.layer, stretch)
            if ops.cp_ring:
                layer = self._with_ring(layout, ops, layer, stretch)
            found = self._units[key] = (layer, self._unit(layout, ops.first, stretch),
                                        self._unit(layout, ops.last, stretch))
        return found

    def _with_ring(self, layout: Layout, ops: PassOps, layer: UnitTime,
                   stretch: float) -> UnitTime:
        """A layer with what its CP ring leaves exposed: each message beyond the ring step
        it runs beside (a forward step waits for the block before it; the backward's last
        message, for qkv's backward), alone on the network."""
        compute = self._of(layout)[0]
        steps = {phase: next(compute.duration(op) * stretch for op, axis in placed
                             if op.purpose == KernelRun(Kernel.FLASH_ATTN)
                             and op.phase is phase)
                 for phase, placed in ((Phase.FWD, ops.layer.compute_fwd),
                                       (Phase.BWD, ops.layer.compute_bwd))}
        exposed = {Phase.FWD: 0.0, Phase.BWD: 0.0, Phase.RECOMPUTE: 0.0}
        for phase, size in ops.cp_ring:
            step = steps[Phase.BWD if phase is Phase.BWD else Phase.FWD]
            exposed[phase] += max(self._cp_send(layout, size) - step, 0.0)
        fwd, bwd = exposed[Phase.FWD], exposed[Phase.BWD] + exposed[Phase.RECOMPUTE]
        return dataclasses.replace(
            layer, compute_fwd=layer.compute_fwd + fwd, compute_bwd=layer.compute_bwd + bwd,
            beside_fwd=layer.beside_fwd + fwd, beside_bwd=layer.beside_bwd + bwd)

    def _cp_send(self, layout: Layout, size: float) -> float:
        """One CP ring message between neighbouring CP ranks."""
        if self.free_network:
            return 0.0
        src, dst = layout.rank(cp=0), layout.rank(cp=1)
        return analytic_time(self.cluster, self.collectives.p2p(src, dst), size)

    def _unit(self, layout: Layout, unit: UnitOps, stretch: float = 1.0) -> UnitTime:
        compute, interference = self._of(layout)

        def total(placed: tuple[Placed, ...], beside: bool = False) -> float:
            """Ops in order; each tp_comm_overlap region by its closed form; `beside`: each
            kernel slowed by communication in flight."""
            axes = {id(op): axis for op, axis in placed}

            def seconds(op: Op) -> float:
                axis = axes[id(op)]
                if axis:
                    return self._op_time(layout, op, axis)
                alone = compute.duration(op) * stretch
                return alone * interference.kernel_scale(op) if beside else alone

            out = 0.0
            for overlapped, run in groupby(placed, key=lambda p: _region_key(p[0])):
                ops = [op for op, _ in run]
                out += sum(map(seconds, ops)) if overlapped is None else \
                    region_seconds(ops, seconds)
            return out

        kernels = sum(compute.duration(op) * stretch for op, axis in
                      unit.compute_fwd + unit.compute_bwd if not axis)
        return UnitTime(compute_fwd=total(unit.compute_fwd), side_fwd=total(unit.side_fwd),
                         compute_bwd=total(unit.compute_bwd), side_bwd=total(unit.side_bwd),
                         kernels=kernels, tail=total(unit.final),
                         beside_fwd=total(unit.compute_fwd, True),
                         beside_bwd=total(unit.compute_bwd, True))

    def _op_time(self, layout: Layout, op: Op, axis: str) -> float:
        if not axis:
            return self._of(layout)[0].duration(op)
        if peer_copy(op) and not self.free_network:  # a peer copy (sim.engine.lowering)
            exchange = self.collectives.lowering(op.kind, self.group(layout, axis), EXCHANGE)
            assert exchange is not None
            return analytic_time(self.cluster, exchange, op.size_bytes)
        return self._collective(op.kind, self.group(layout, axis), op.size_bytes, op.split)

    def _collective(self, kind: OpKind, group: tuple[int, ...], size: float,
                    split: AllToAllv | None = None) -> float:
        """Alpha-beta seconds of the lowering the replay would use, alone on the network (an
        uneven all-to-all by its per-peer sizes, `split`)."""
        key = (kind, group, size, split)
        seconds = self._comm.get(key)
        if seconds is None:
            if self.free_network or size <= 0 or len(group) < 2:
                seconds = 0.0
            else:
                _, lowering = self.collectives.resolve(kind, group, size, self.algo,
                                                       split=split)
                seconds = analytic_time(self.cluster, lowering, size)
            self._comm[key] = seconds
        return seconds

    def _send(self, layout: Layout, size: float) -> float:
        """One pipeline send between neighbouring stages (0 without a pipeline)."""
        if layout.pp == 1 or self.free_network:
            return 0.0
        src, dst = layout.rank(pp=0), layout.rank(pp=1)
        return analytic_time(self.cluster, self.collectives.p2p(src, dst), size)


# `traces.pipeline.build_schedule` without its deadlock check, which costs more than the rest
# of an estimate: the same generators; the simulation validates every plan it runs.
# (`extra`: one more warm-up forward under interleaving with overlap_moe_comm)
_GENERATORS: dict[Schedule, Callable[[int, int, int, int], ActionSchedule]] = {
    Schedule.GPIPE: lambda pp, m, vp, extra: gpipe(pp, m),
    Schedule.ONE_F_ONE_B: lambda pp, m, vp, extra: one_f_one_b(pp, m, extra),
    Schedule.INTERLEAVED: lambda pp, m, vp, extra: interleaved(pp, vp, m, extra),
    Schedule.ZB1P: lambda pp, m, vp, extra: zb1p(pp, m, vp),
    Schedule.ZBV: lambda pp, m, vp, extra: build_schedule("zbv", pp, m, vp),
    Schedule.DUALPIPEV: lambda pp, m, vp, extra: build_schedule("dualpipev", pp, m, vp),
    Schedule.DUALPIPE: lambda pp, m, vp, extra: build_schedule("dualpipe", pp, m, vp),
}


def _region_key(op: Op) -> tuple[object, ...] | None:
    """Ops of one tp_comm_overlap region share a key (kernel, layer, micro-batch, phase);
    every other op has none."""
    if not in_region(op):
        return None
    return (getattr(op.purpose, "kernel", None), op.layer, op.microbatch, op.phase)


_EXPERT_GROUPS = {"ep": ep_group, "etp": etp_group, "edp": expert_data_group}
"""MoE's axes (`sim.search.passes._axis`): the expert grid's groups of a rank."""


def _holding(peak: int) -> list[Action]:
    """A schedule fragment holding `peak` micro-batches in flight: all `pp_rank_memory` reads
    of a rank's actions is that peak (`peak_in_flight`)."""
    return [Action(0, "F", i) for i in range(peak)]
