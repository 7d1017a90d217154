"""Fitting the interference of compute and communication on one host, both ways.

    kernels, comm, wait = fit_interference([trace, ...])   # None each: no such samples

From the microbenchmarks' interference section (`traces.bench`): comm_interference is the
probes' mean beside a collective over their mean alone, less 1; a collective beside kernels
takes delay + (1 + compute_interference) times its mean alone, fitted by least squares over
both sizes. A figure without enough samples, or with too wide an interval, is not identified
and keeps the base profile's value (`sim.models.interference` uses them).

In full: docs/calibration.md ("Interference").
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import stats

from sim.profile import MAX_COMM_INTERFERENCE
from traces.fields import MAX_LATENCY_S
from traces.ops import Op, Trace
from traces.purpose import Bench, BenchRole

_BESIDE = Bench(BenchRole.COLLECTIVE_BESIDE)
_ALONE = Bench(BenchRole.COLLECTIVE_ALONE)
_PROBE_ALONE = Bench(BenchRole.PROBE_ALONE)
_PROBE_OVERLAPPED = Bench(BenchRole.PROBE_OVERLAPPED)

MAX_HALF_WIDTH = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class InterferenceFit:
    value: float
    """overlapped / alone - 1, at least 0 (for the delay: seconds)."""
    ci: tuple[float, float]
    """Its 95% interval (clamped at 0)."""
    alone_s: float
    """Mean duration alone (of the probe; of the collective, the largest size; for the delay,
    the smallest)."""
    overlapped_s: float
    """Mean duration beside the other (the same size)."""
    num_alone: int
    num_overlapped: int
    num_outlived: int
    """Samples left out: they were not wholly beside the other."""
    unidentified: str | None = None
    """Why the data do not pin it down (None: they do)."""


@dataclass(slots=True)
class _Samples:
    alone: list[float]
    beside: list[float]
    outlived: int = 0
    alone_sizes: list[float] = field(default_factory=list)
    beside_sizes: list[float] = field(default_factory=list)
    """Per sample, the collective's size (collectives only)."""

    def add(self, other: _Samples) -> None:
        self.alone += other.alone
        self.beside += other.beside
        self.outlived += other.outlived
        self.alone_sizes += other.alone_sizes
        self.beside_sizes += other.beside_sizes

    def size(self, size: float) -> _Samples:
        """The samples of one collective size."""
        return _Samples([t for t, s in zip(self.alone, self.alone_sizes) if s == size],
                        [t for t, s in zip(self.beside, self.beside_sizes) if s == size])


def probe_samples(trace: Trace) -> _Samples:
    """The probes alone, and those beside that ran inside their rank's collective."""
    out = _Samples([], [])
    for ops in trace.ops.values():
        last: Op | None = None  # the rank's latest collective beside probes
        for op in ops:
            if op.start is None or op.end is None or op.span is not None:
                continue
            if op.purpose == _BESIDE and op.kind.is_collective:
                last = op
            elif op.purpose == _PROBE_ALONE:
                out.alone.append(op.end - op.start)
            elif op.purpose == _PROBE_OVERLAPPED:
                assert last is not None and last.start is not None and last.end is not None, \
                    "an overlapped probe follows its collective"
                if last.start <= op.start and op.end <= last.end:
                    out.beside.append(op.end - op.start)
                else:
                    out.outlived += 1
    return out


def collective_samples(trace: Trace) -> _Samples:
    """The collectives alone, and beside the chain of probes issued right after them: the
    simulator's condition (a kernel runs as they start) holds for all of these, however soon
    they end; each from its members' latest start to their mean end."""
    calls: dict[tuple[BenchRole, int], list[Op]] = defaultdict(list)
    for ops in trace.ops.values():
        count = dict.fromkeys((_BESIDE, _ALONE), 0)
        for op in ops:
            if op.start is None or op.end is None or op.span is not None:
                continue
            if op.purpose in count and op.kind.is_collective:
                assert isinstance(op.purpose, Bench)
                calls[(op.purpose.role, count[op.purpose])].append(op)
                count[op.purpose] += 1
    out = _Samples([], [])
    for (role, _), members in sorted(calls.items()):
        if len(members) != len(members[0].group):
            continue  # a partial trace: the collective's members are not all here
        start = max(m.start for m in members if m.start is not None)
        end = statistics.fmean(m.end for m in members if m.end is not None)
        into, sizes = (out.alone, out.alone_sizes) if role is BenchRole.COLLECTIVE_ALONE \
            else (out.beside, out.beside_sizes)
        into.append(end - start)
        sizes.append(members[0].size_bytes)
    return out


def fit_interference(traces: Sequence[Trace], *, delay_s: float = 0.0
                     ) -> tuple[InterferenceFit | None, InterferenceFit | None,
                                InterferenceFit | None]:
    """comm_interference (from the probes), compute_interference and its delay (from the
    collectives); None where the traces hold no such samples. `delay_s` is the base's delay,
    which the slowdown is fitted beside where the traces do not pin the delay down."""
    probes, colls = _Samples([], []), _Samples([], [])
    for trace in traces:
        probes.add(probe_samples(trace))
        colls.add(collective_samples(trace))
    kernels = _ratio(probes, "probes", relative=False)
    if not colls.alone and not colls.beside and not colls.outlived:
        return kernels, None, None
    by_size = {size: got for size in sorted(set(colls.beside_sizes))
               if len((got := colls.size(size)).alone) >= 2 and len(got.beside) >= 2}
    sizes = list(by_size)
    wait: InterferenceFit | None = None
    held = delay_s
    if len(sizes) >= 2:
        slow, wait = _line(by_size, colls.outlived)
        if slow.unidentified is None and wait.unidentified is None:
            return kernels, slow, wait
        if wait.unidentified is None:
            held = wait.value
    elif colls.beside:
        wait = InterferenceFit(
            value=math.nan, ci=(math.nan, math.nan), alone_s=math.nan, overlapped_s=math.nan,
            num_alone=len(colls.alone), num_overlapped=len(colls.beside),
            num_outlived=colls.outlived, unidentified="the collectives beside kernels are of "
            "one size (the wait for a core needs two)")
    # The slowdown alone: what the largest size loses beside kernels after the delay (the
    # fitted one, or else the base's).
    large = by_size[sizes[-1]] if sizes else colls
    beside = _ratio(_Samples(large.alone, [t - held for t in large.beside], colls.outlived),
                    "collectives", relative=True)
    assert beside is not None, "the collectives have samples"
    return kernels, replace(beside, overlapped_s=beside.overlapped_s + held), wait


def _line(by_size: dict[float, _Samples], outlived: int
          ) -> tuple[InterferenceFit, InterferenceFit]:
    """beside = delay + (1 + compute_interference) · alone, by least squares over the
    collectives beside kernels (each against its size's mean alone; sizes ascending), the
    delay at least 0 and the slope at least 1; 95% intervals from the residuals (Student's
    t)."""
    sizes = list(by_size)
    alone = {size: statistics.fmean(got.alone) for size, got in by_size.items()}
    x = np.array([alone[size] for size in sizes for _ in by_size[size].beside])
    y = np.array([t for size in sizes for t in by_size[size].beside])
    slope, delay = (float(v) for v in np.polyfit(x, y, 1))
    if delay < 0.0:  # through the origin
        slope, delay = float(x @ y / (x @ x)), 0.0
    if slope < 1.0:
        slope, delay = 1.0, max(0.0, float(np.mean(y - x)))
    design = np.column_stack([x, np.ones_like(x)])
    residual = y - design @ np.array([slope, delay])
    dof = max(1, len(y) - 2)
    cov = float(residual @ residual) / dof * np.linalg.pinv(design.T @ design)
    half_slope, half_delay = (float(h) for h in stats.t.ppf(0.975, dof)
                              * np.sqrt(np.maximum(np.diag(cov), 0.0)))
    small, large = by_size[sizes[0]], by_size[sizes[-1]]
    common = dict(num_alone=sum(len(g.alone) for g in by_size.values()), num_overlapped=len(y),
                  num_outlived=outlived)
    value = min(float(slope) - 1.0, MAX_COMM_INTERFERENCE)
    slow = InterferenceFit(
        value=value, ci=(max(0.0, value - half_slope), value + half_slope),
        alone_s=alone[sizes[-1]], overlapped_s=statistics.fmean(large.beside),
        unidentified=None if half_slope <= MAX_HALF_WIDTH * slope else
        f"{value:.3g} with a 95% interval of ±{half_slope:.3g} ({len(y)} collectives beside "
        f"kernels, {len(sizes)} sizes)", **common)  # type: ignore[arg-type]
    beside_small = statistics.fmean(small.beside)
    delay = min(float(delay), MAX_LATENCY_S)
    wait = InterferenceFit(
        value=delay, ci=(max(0.0, delay - half_delay), delay + half_delay),
        alone_s=alone[sizes[0]], overlapped_s=beside_small,
        unidentified=None if half_delay <= MAX_HALF_WIDTH * beside_small else
        f"{delay * 1e3:.3g} ms with a 95% interval of ±{half_delay * 1e3:.3g} ms ({len(y)} "
        f"collectives beside kernels, {len(sizes)} sizes)", **common)  # type: ignore[arg-type]
    return slow, wait


def _ratio(s: _Samples, what: str, *, relative: bool) -> InterferenceFit | None:
    if not s.alone and not s.beside and not s.outlived:
        return None
    mean_a = statistics.fmean(s.alone) if s.alone else math.nan
    mean_o = statistics.fmean(s.beside) if s.beside else math.nan
    counts = dict(alone_s=mean_a, overlapped_s=mean_o, num_alone=len(s.alone),
                  num_overlapped=len(s.beside), num_outlived=s.outlived)
    if len(s.alone) < 2 or len(s.beside) < 2:
        why = (f"{len(s.alone)} {what} alone and {len(s.beside)} beside the other (an "
               "interval needs 2 of each)")
        if s.outlived:
            why += f"; {s.outlived} {what} not wholly beside the other"
        return InterferenceFit(value=math.nan, ci=(math.nan, math.nan), unidentified=why,
                               **counts)  # type: ignore[arg-type]
    ratio = mean_o / mean_a
    rel_var = (statistics.variance(s.beside) / (len(s.beside) * mean_o * mean_o)
               + statistics.variance(s.alone) / (len(s.alone) * mean_a * mean_a))
    half = 1.96 * ratio * math.sqrt(rel_var)
    value = min(max(0.0, ratio - 1.0), MAX_COMM_INTERFERENCE)
    bound = MAX_HALF_WIDTH * (ratio if relative else 1.0)
    return InterferenceFit(
        value=value, ci=(max(0.0, ratio - 1.0 - half), max(0.0, ratio - 1.0 + half)),
        unidentified=None if half <= bound else
        f"{value:.3g} with a 95% interval of ±{half:.3g} ({len(s.alone)} {what} alone, "
        f"{len(s.beside)} beside the other)", **counts)  # type: ignore[arg-type]
