"""Where the step's time goes, and the throughput figures Megatron-LM papers report.

Per rank, over the step [0, T]: `compute_s` is the time some compute op runs; `exposed_comm_s`
the time some communication moves data while no compute runs (tensor-parallel collectives on
the compute stream are always exposed; overlapped gradient reductions are not); `idle_s` the
rest, T - compute - exposed (the pipeline bubble, waiting for other stages). Activation offload
copies (streams `d2h` / `h2d`, `traces.plan.offload`) move data too: they count as
communication, exposed where no compute runs beside them.

Model FLOPs count one forward and backward of every matmul (Megatron's 72*B*s*l*h^2*(...)
form); hardware FLOPs are what the GPUs execute, recomputation included (the 96* form under
full recomputation, less what a causal flash kernel skips: `traces.kernels.FLASH_CAUSAL`). Both
are per GPU per second of step time; MFU is the first over the dense peak of the run's GEMM
precision (`gemm_peak`: an fp8 model against the FP8 peak, as NVIDIA's benchmarks report it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, is_

import numpy as np

from sim.engine.replay import StepTimes
from sim.models.memory import MemoryBreakdown
from topology.cluster import Accelerator, Cluster
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import COPY_STREAMS, OpKind
from traces.step_flops import model_flops


@dataclass(frozen=True, slots=True, kw_only=True)
class RankTime:
    rank: int
    pp_rank: int
    compute_s: float
    exposed_comm_s: float
    idle_s: float


@dataclass(frozen=True, kw_only=True)
class StepSummary:
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    """Mean idle time over the step, a fraction."""
    exposed_comm_s: float
    compute_s: float
    peak_memory_bytes: float
    fits: bool
    memory_capacity_bytes: float
    ranks: list[RankTime]
    memory_by_pp_rank: list[MemoryBreakdown]
    algorithms: dict[str, int]
    variability_s: float = 0.0
    """What per-rank variability adds to the step (`sim.simulate.predict`; 0 when ideal)."""
    variability_compute_s: float = 0.0
    """What it adds to the mean compute time (its part of the waterfall's kernel time)."""


def rank_times(times: StepTimes, layout: Layout | None = None) -> list[RankTime]:
    step = times.step_time_s
    out = []
    plan_layout = layout or times.plan.meta.layout
    offloads = bool(plan_layout and plan_layout.cpu_offloading_num_layers)
    for rank in times.plan.ranks:
        # np.array of the lists as they are: an int 0 (the clock before any event) and the
        # floats give the same float64s as ever (and a rank of only int 0s int64s)
        starts, ends = np.array(times.starts[rank]), np.array(times.ends[rank])
        ops = times.plan.ops[rank]
        comm = None if times.communication is None else times.communication.get(rank)
        if comm is not None:  # the others are compute: no pass over the ops (0.035 s)
            is_compute = np.ones(len(ops), bool)
            is_compute[np.fromiter(comm, np.intp, len(comm))] = False
        else:  # op.kind is COMPUTE, per op, in C
            is_compute = np.fromiter(map(is_, map(_KIND, ops), repeat(OpKind.COMPUTE)), bool,
                                     len(ops))
        if offloads:  # the copies are compute-kind ops on their own streams: data movement
            is_compute &= np.fromiter((op.stream not in COPY_STREAMS for op in ops), bool,
                                      len(ops))
        busy = _union_length(starts[is_compute], ends[is_compute])
        # |comm outside compute| = |everything| - |compute|
        exposed = _union_length(starts, ends) - busy
        pp_rank = layout.coords(rank).pp if layout else 0
        out.append(RankTime(rank=rank, pp_rank=pp_rank, compute_s=busy, exposed_comm_s=exposed,
                            idle_s=max(step - busy - exposed, 0.0)))
    return out


def summarize(model: ModelSpec, layout: Layout, cluster: Cluster, times: StepTimes,
              memory: list[MemoryBreakdown],
              stand_for: Mapping[int, int] | None = None) -> StepSummary:
    """The step's figures; `stand_for[rank]`, if given, is how many ranks each plan rank
    stands for (a fold by identity, `traces.identity`), else they share the world evenly."""
    step = times.step_time_s
    world = layout.world
    ranks = rank_times(times, layout)
    if stand_for is None:
        # A folded plan has one rank per stage standing for tp * dp identical ones.
        share = world / len(times.plan.ops)
        # the same sum, in the same order, in C
        hw_flops = share * sum(map(_FLOPS, chain.from_iterable(times.plan.ops.values())))
        n = len(ranks)
        idle = sum(r.idle_s for r in ranks) / n
        exposed = sum(r.exposed_comm_s for r in ranks) / n
        busy = sum(r.compute_s for r in ranks) / n
    else:
        assert sum(stand_for[r.rank] for r in ranks) == world, "the classes cover the world"
        hw_flops = sum(stand_for[r] * sum(op.flops for op in ops)
                       for r, ops in times.plan.ops.items())
        idle = sum(stand_for[r.rank] * r.idle_s for r in ranks) / world
        exposed = sum(stand_for[r.rank] * r.exposed_comm_s for r in ranks) / world
        busy = sum(stand_for[r.rank] * r.compute_s for r in ranks) / world
    model_per_gpu = model_flops(model, layout.global_batch) / world / step
    peak = max(m.total_bytes for m in memory)
    return StepSummary(
        step_time_s=step,
        tokens_per_s=layout.global_batch * model.seq_len / step,
        model_tflops_per_gpu=model_per_gpu / 1e12,
        hardware_tflops_per_gpu=hw_flops / world / step / 1e12,
        mfu=model_per_gpu / gemm_peak(model, cluster.accelerator),
        bubble_fraction=idle / step,
        exposed_comm_s=exposed,
        compute_s=busy,
        peak_memory_bytes=peak,
        fits=peak <= cluster.accelerator.memory_bytes,
        memory_capacity_bytes=cluster.accelerator.memory_bytes,
        ranks=ranks,
        memory_by_pp_rank=memory,
        algorithms=dict(sorted(times.algorithms.items())),
    )


_KIND, _FLOPS = attrgetter("kind"), attrgetter("flops")



def gemm_peak(model: ModelSpec, accelerator: Accelerator) -> float:
    """The dense peak MFU is measured against: FP4's for an fp4 model, FP8's for an fp8 one,
    else bf16's."""
    if model.fp4:
        return accelerator.peak_flops_fp4
    return accelerator.peak_flops_fp8 if model.fp8 else accelerator.peak_flops


def gemm_precision(model: ModelSpec) -> str:
    """The precision `gemm_peak` is the peak of, as the report labels it: the model's dtype
    ("fp8", "fp4"; "bf16", "fp32" on the CPU)."""
    return model.dtype


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by the intervals [starts[i], ends[i])."""
    if not len(starts):
        return 0.0
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)  # furthest end so far
    # each interval adds what sticks out beyond everything before it
    before = np.concatenate(([starts[0]], reach[:-1]))
    return float(np.sum(np.maximum(ends - np.maximum(starts, before), 0.0)))
