"""Fitting `comm_interference`: how much slower a rank's kernels run while it moves data.

    fit = fit_interference([trace, ...])     # None: no interference section in the traces

The microbenchmarks' interference section (`traces.bench`) times one probe GEMM alone and the
same probe while a collective of its own rank is in flight on another stream. The simulator
runs a kernel that starts while its rank has communication in flight (1 + comm_interference)
times as long (`sim.replay`), so

    comm_interference = mean(overlapped) / mean(alone) - 1        clamped at 0

over the overlapped probes that ran wholly inside their rank's collective (one the collective
outlived; a probe the collective ended under is left out, counted). The 95% interval is the
delta method's on the ratio of two means, each with its standard error:

    var(r) ≈ r² · (s_o² / (n_o · m_o²) + s_a² / (n_a · m_a²))

A figure without at least 2 probes of each kind has no interval, and one whose interval is
wider than ±MAX_HALF_WIDTH (kernels 50% slower or faster than the figure says) is not pinned
down: neither is identified, and the fit keeps the base profile's value.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sim.profile import MAX_COMM_INTERFERENCE
from traces.bench import INTERFERENCE_ALONE, INTERFERENCE_COLLECTIVE, INTERFERENCE_OVERLAPPED
from traces.ops import Op, Trace

MAX_HALF_WIDTH = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class InterferenceFit:
    value: float
    """comm_interference: overlapped / alone - 1, at least 0."""
    ci: tuple[float, float]
    """Its 95% interval (clamped at 0)."""
    alone_s: float
    """Mean duration of the probe alone."""
    overlapped_s: float
    """Mean duration of the probe while a collective was in flight."""
    num_alone: int
    num_overlapped: int
    num_outlived: int
    """Overlapped probes left out: their collective ended before they did."""
    unidentified: str | None = None
    """Why the data do not pin it down (None: they do)."""


def samples(trace: Trace) -> tuple[list[float], list[float], int]:
    """Durations of the probes alone and of the overlapped probes that ran inside their
    rank's collective, and how many overlapped probes were left out."""
    alone: list[float] = []
    overlapped: list[float] = []
    outlived = 0
    for ops in trace.ops.values():
        last: Op | None = None  # the rank's latest interference collective
        for op in ops:
            if op.start is None or op.end is None or op.span is not None:
                continue
            if op.name == INTERFERENCE_COLLECTIVE and op.kind.is_collective:
                last = op
            elif op.name == INTERFERENCE_ALONE:
                alone.append(op.end - op.start)
            elif op.name == INTERFERENCE_OVERLAPPED:
                assert last is not None and last.start is not None and last.end is not None, \
                    "an overlapped probe follows its collective"
                if last.start <= op.start and op.end <= last.end:
                    overlapped.append(op.end - op.start)
                else:
                    outlived += 1
    return alone, overlapped, outlived


def fit_interference(traces: Sequence[Trace]) -> InterferenceFit | None:
    """comm_interference from the traces' interference probes (None: they hold none)."""
    alone: list[float] = []
    overlapped: list[float] = []
    outlived = 0
    for trace in traces:
        a, o, n = samples(trace)
        alone += a
        overlapped += o
        outlived += n
    if not alone and not overlapped and not outlived:
        return None
    if len(alone) < 2 or len(overlapped) < 2:
        why = (f"{len(alone)} probes alone and {len(overlapped)} inside a collective (an "
               "interval needs 2 of each)")
        if outlived:
            why += f"; {outlived} overlapped probes outlived their collective"
        mean_a = statistics.fmean(alone) if alone else math.nan
        mean_o = statistics.fmean(overlapped) if overlapped else math.nan
        return InterferenceFit(value=math.nan, ci=(math.nan, math.nan), alone_s=mean_a,
                               overlapped_s=mean_o, num_alone=len(alone),
                               num_overlapped=len(overlapped), num_outlived=outlived,
                               unidentified=why)
    ma, mo = statistics.fmean(alone), statistics.fmean(overlapped)
    ratio = mo / ma
    rel_var = (statistics.variance(overlapped) / (len(overlapped) * mo * mo)
               + statistics.variance(alone) / (len(alone) * ma * ma))
    half = 1.96 * ratio * math.sqrt(rel_var)
    value = min(max(0.0, ratio - 1.0), MAX_COMM_INTERFERENCE)
    return InterferenceFit(value=value, ci=(max(0.0, ratio - 1.0 - half),
                                            max(0.0, ratio - 1.0 + half)),
                           alone_s=ma, overlapped_s=mo, num_alone=len(alone),
                           num_overlapped=len(overlapped), num_outlived=outlived,
                           unidentified=None if half <= MAX_HALF_WIDTH else
                           f"{value:.3g} with a 95% interval of ±{half:.3g} ({len(alone)} "
                           f"probes alone, {len(overlapped)} beside a collective)")
