"""What the captured traces say about each kernel class: measured durations by exact shape,
the host's launch gaps, and a fit (calibrate's) for shapes the capture never ran.

    book = learn(traces, capture_cluster, model, layout)
    timing = book.time(op)      # seconds, host gap, and where they came from

A shape the capture ran (the same kernel, phase, FLOPs, bytes, GEMM dims and draws: the key
`sim.calibrate.observe` groups samples by) takes its measured durations and the idle time
the host left before it, summed up by the `Statistic` (default: median x the capture's load
factor, and the mean gap) (`sim.engine.replay.host_gaps`). Any other shape of a
class the capture ran is extrapolated:

* fitted, where `sim.calibrate.fit.fit_profile` pins the class's rate down from the same
  traces (it needs several shapes of it): the compute model with the fitted profile. The fit
  times what an op holds its stream for, host time included, so the op gets no separate
  gap. Its uncertainty is the fit's: the 95% half-width of the rate, or the class's relative
  RMS residual if larger.
* scaled, where it does not (one capture at one layout runs each class at one shape): the
  measured figure of the class's nearest shape (same phase, nearest work in log terms),
  times the compute model's ratio of the two shapes' times, plus that shape's host gap. Its
  uncertainty is how far two scalings disagree: the model's ratio and plain proportion to
  the work (FLOPs, else bytes), |s_model - s_work| / s_model, capped at ±100%.

A class the capture never ran is timed by `--profile`'s figures (±100%), or refused.

The fitted, scaling and `--profile` compute models are the one `simulate` times the target's
plan by (`sim.models.host.plan_compute`: its FP8 rate, expert GEMM streams, split GEMMs and
device launches), on the capture's accelerator.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from sim.calibrate.fit import fit_profile
from sim.engine.replay import host_gaps
from sim.models.compute import ComputeModel
from sim.models.host import plan_compute
from sim.profile import Profile, default_profile
from topology.cluster import Cluster
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Phase, Trace
from traces.purpose import KernelRun

UNPINNED = 1.0
"""The relative uncertainty of a fitted class whose rate the data leave free: ±100%."""


class Statistic(StrEnum):
    """What stands for a shape's measured times. A step's time is a sum of its ops' times, so
    what predicts it is each op's expected time, n x mean, not n x median: on a shared host a
    few ops are preempted for milliseconds, and the median leaves that out.

    `load` (the default): the shape's median times one load factor of the whole capture,
    F = (sum of every measured time) / (sum of each op's shape median). It reproduces the
    captured compute total exactly, as the mean does, but spreads the preemptions over the ops
    in proportion to their typical time (a time slice taken from the process hits an op with a
    chance proportional to how long it runs), not onto the few shapes they happened to hit:
    a target that reweights the shapes (PP halves the layers, TP the GEMMs) keeps the right
    total. Host gaps take their mean (their expected sum). `mean`: each shape's own mean;
    `median`: each shape's median (an idle host's figure)."""

    LOAD = "load"
    MEAN = "mean"
    MEDIAN = "median"
    SHARE = "share"
    """Each shape's median (its unpreempted time) and host gaps' median, and the step no
    shorter than each rank's CPU work over the share of a core the target's ranks get
    (`sim.whatif.predict._cpu_bound`): the scheduler time-slices a rank that computes the
    whole step, but serves the short bursts of one that sleeps in communication at once."""

    def of(self, values: Sequence[float]) -> float:
        """One shape's figure (`load`: the median, times the load factor in `learn`)."""
        return statistics.fmean(values) if self is Statistic.MEAN else statistics.median(values)


def load_factor(durations: Mapping[tuple[object, ...], Sequence[float]]) -> float:
    """F of `Statistic.LOAD`: the measured total over the total of the shapes' medians."""
    typical = sum(statistics.median(v) * len(v) for v in durations.values())
    total = sum(sum(v) for v in durations.values())
    return total / typical if typical > 0 else 1.0


class Source(StrEnum):
    """Where an op's time comes from."""

    OWN = "own"
    """The captured op itself: the target runs it at the same place (replay's rule)."""
    MEASURED = "measured"
    """The capture's ops of this exact shape, summed up by the `Statistic`."""
    FITTED = "fitted"
    """The compute model with the profile fitted to the capture: a shape it never ran."""
    SCALED = "scaled"
    """The nearest measured shape's median, scaled by the compute model: a shape it never
    ran, of a class whose rate the fit could not pin down."""
    PROFILE = "profile"
    """The compute model with --profile's figures: a class the capture never ran."""


@dataclass(frozen=True, slots=True)
class Timing:
    seconds: float
    gap_s: float
    source: Source
    kernel: str
    uncertainty: float = 0.0
    """Relative half-width of `seconds` (0 for measured times)."""
    ratio: float = 1.0
    """Extrapolated: the op's work over the nearest work the capture measured for its class."""

    @property
    def extrapolated(self) -> bool:
        return self.source in (Source.FITTED, Source.SCALED, Source.PROFILE)


def shape_key(op: Op) -> tuple[object, ...]:
    """Ops of one kernel on one shape share this key (`ComputeSample.key`'s fields)."""
    return (kernel_of(op), op.phase is Phase.BWD, float(op.flops), float(op.mem_bytes),
            tuple(op.gemm), float(op.draws))


def kernel_of(op: Op) -> str:
    return str(op.purpose.kernel) if isinstance(op.purpose, KernelRun) else op.name


def work(op: Op) -> float:
    """What the fit scales with: FLOPs, else bytes."""
    return float(op.flops) if op.flops else float(op.mem_bytes)


@dataclass(frozen=True, slots=True)
class KernelBook:
    durations: Mapping[tuple[object, ...], float]
    """Measured seconds by `shape_key` (the `Statistic`'s figure)."""
    gaps: Mapping[tuple[object, ...], float]
    """Host gap (the `Statistic`'s figure) by `shape_key` (compute) or (kind, name)
    (communication)."""
    shapes: Mapping[tuple[str, bool], tuple[Op, ...]]
    """Per kernel class and phase (backward?), one untimed op of each shape measured."""
    model: ComputeModel
    """The compute model that scales a measured shape to another: the fitted profile's, else
    the capture accelerator's default."""
    uncertainty: Mapping[str, float]
    """Per class the fit pinned down, the relative half-width of its predicted times."""
    fallback: ComputeModel | None
    """--profile's model, for classes the capture never ran (None: refuse them)."""

    def time(self, op: Op) -> Timing:
        """An untimed compute op's seconds and host gap, and where they came from."""
        key = shape_key(op)
        name = kernel_of(op)
        if key in self.durations:
            return Timing(self.durations[key], self.gaps.get(key, 0.0), Source.MEASURED, name)
        near = self._nearest(op)
        if near is not None:
            ratio = _ratio(work(op), work(near))
            if name in self.uncertainty:
                return Timing(self.model.duration(op), 0.0, Source.FITTED, name,
                              self.uncertainty[name], ratio)
            s_model = self.model.duration(op) / self.model.duration(near)
            doubt = min(UNPINNED, abs(s_model - ratio) / s_model) if s_model > 0 else UNPINNED
            k = shape_key(near)
            return Timing(self.durations[k] * s_model, self.gaps.get(k, 0.0), Source.SCALED,
                          name, doubt, ratio)
        if self.fallback is not None:
            return Timing(self.fallback.duration(op), 0.0, Source.PROFILE, name, UNPINNED)
        raise ConfigError(f"target: kernel {name} never ran in the capture; give --profile P "
                          "to time it by a profile's figures")

    def gap(self, op: Op) -> float:
        """A communication op's host gap: the median the capture shows for its kind and name."""
        return self.gaps.get((str(op.kind), op.name), 0.0)


    def _nearest(self, op: Op) -> Op | None:
        """The measured op of `op`'s class and phase whose work is nearest in log terms."""
        seen = self.shapes.get((kernel_of(op), op.phase is Phase.BWD), ())
        return min(seen, key=lambda m: abs(math.log(_ratio(work(op), work(m)))), default=None)


def _ratio(target: float, measured: float) -> float:
    """`target` over `measured` (1 where either is 0)."""
    return target / measured if target > 0 and measured > 0 else 1.0


def learn(traces: Sequence[Trace], cluster: Cluster, model: ModelSpec, layout: Layout,
          fallback: Profile | None = None, statistic: Statistic = Statistic.LOAD
          ) -> KernelBook:
    """The book of `traces` (timed, of one job on `cluster`) for the target's `model` on
    `layout`, whose kernels its compute models time as `simulate` does (`plan_compute`);
    `fallback` times classes they never ran; `statistic` sums up each shape's measured times
    and host gaps."""
    durations: dict[tuple[object, ...], list[float]] = defaultdict(list)
    gaps: dict[tuple[object, ...], list[float]] = defaultdict(list)
    shapes: dict[tuple[str, bool], dict[tuple[object, ...], Op]] = defaultdict(dict)
    for trace in traces:
        measured = host_gaps(trace)
        for rank, ops in trace.ops.items():
            for op, gap in zip(ops, measured[rank]):
                if op.start is None or op.end is None or op.span is not None:
                    continue
                if op.kind is OpKind.COMPUTE:
                    key = shape_key(op)
                    durations[key].append(op.end - op.start)
                    shapes[(kernel_of(op), op.phase is Phase.BWD)].setdefault(
                        key, replace(op, start=None, end=None))
                else:
                    key = (str(op.kind), op.name)
                gaps[key].append(gap)
    fitted, uncertainty = _fit(traces, cluster, model, layout)
    factor = load_factor(durations) if statistic is Statistic.LOAD else 1.0
    gap_statistic = Statistic.MEAN if statistic is Statistic.LOAD else statistic
    fallback_model = plan_compute(cluster, fallback, model, layout) if fallback else None
    return KernelBook(
        durations={k: statistic.of(v) * factor for k, v in durations.items()},
        gaps={k: gap_statistic.of(v) for k, v in gaps.items()},
        shapes={k: tuple(v.values()) for k, v in shapes.items()}, model=fitted,
        uncertainty=uncertainty, fallback=fallback_model)


def _fit(traces: Sequence[Trace], cluster: Cluster, model: ModelSpec, layout: Layout
         ) -> tuple[ComputeModel, dict[str, float]]:
    """calibrate's fit of the traces, as a compute model on the capture's accelerator, and
    the relative uncertainty of each class whose rate it pins down; the accelerator's
    default profile and none if the traces pin nothing down."""
    base = default_profile(cluster.accelerator)
    try:
        profile, report = fit_profile(traces, cluster, base=base, name="whatif-fit")
    except ConfigError:
        return plan_compute(cluster, base, model, layout), {}
    uncertainty = {}
    for k in report.compute.kernels if report.compute else ():
        if k.identified and math.isfinite(k.rel_ci):
            uncertainty[k.name] = min(UNPINNED, max(k.rel_ci, k.rms_error))
    return plan_compute(cluster, profile, model, layout), uncertainty
