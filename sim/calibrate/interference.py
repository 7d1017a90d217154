"""Fitting the interference of compute and communication on one host, both ways.

    kernels, comm = fit_interference([trace, ...])   # (None, None): no interference section

The microbenchmarks' interference section (`traces.bench`) times, per repeat, a probe GEMM
alone, a collective alone, and then the two together: the collective in flight on another
stream with a chain of probes beside it. The simulator runs a kernel that starts while its
rank has communication in flight (1 + comm_interference) times as long, and communication that
starts while one of its ranks runs a kernel (1 + compute_interference) times as long
(`sim.replay`), so

    comm_interference    = mean(probes beside) / mean(probes alone) - 1        clamped at 0
    compute_interference = mean(collective beside) / mean(collective alone) - 1

A probe counts beside if it ran wholly inside its rank's collective, a collective if the chain
of probes outlasted it on every member (the others are left out, counted). A collective lasted,
as `sim.calibrate.observe` times it, from its members' latest start to their mean end. The
95% interval is the delta method's on the ratio of two means, each with its standard error:

    var(r) ≈ r² · (s_o² / (n_o · m_o²) + s_a² / (n_a · m_a²))

A figure without at least 2 samples of each kind has no interval, and one whose interval is
wider than ±MAX_HALF_WIDTH (for the collective: of its ratio) is not pinned down: it is not
identified, and the fit keeps the base profile's value.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from sim.profile import MAX_COMM_INTERFERENCE
from traces.bench import (
    INTERFERENCE_ALONE,
    INTERFERENCE_COLLECTIVE,
    INTERFERENCE_COLLECTIVE_ALONE,
    INTERFERENCE_OVERLAPPED,
)
from traces.ops import Op, Trace

MAX_HALF_WIDTH = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class InterferenceFit:
    value: float
    """overlapped / alone - 1, at least 0."""
    ci: tuple[float, float]
    """Its 95% interval (clamped at 0)."""
    alone_s: float
    """Mean duration alone (of the probe, or of the collective)."""
    overlapped_s: float
    """Mean duration beside the other."""
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


def probe_samples(trace: Trace) -> _Samples:
    """The probes alone, and those beside that ran inside their rank's collective."""
    out = _Samples([], [])
    for ops in trace.ops.values():
        last: Op | None = None  # the rank's latest collective beside probes
        for op in ops:
            if op.start is None or op.end is None or op.span is not None:
                continue
            if op.name == INTERFERENCE_COLLECTIVE and op.kind.is_collective:
                last = op
            elif op.name == INTERFERENCE_ALONE:
                out.alone.append(op.end - op.start)
            elif op.name == INTERFERENCE_OVERLAPPED:
                assert last is not None and last.start is not None and last.end is not None, \
                    "an overlapped probe follows its collective"
                if last.start <= op.start and op.end <= last.end:
                    out.beside.append(op.end - op.start)
                else:
                    out.outlived += 1
    return out


def collective_samples(trace: Trace) -> _Samples:
    """The collectives alone, and those beside probes that the chain outlasted on every
    member; each from its members' latest start to their mean end."""
    calls: dict[tuple[str, int], list[Op]] = defaultdict(list)
    chain_end: dict[tuple[int, int], float] = {}  # (rank, repeat): the chain's last end
    for rank, ops in trace.ops.items():
        count = dict.fromkeys((INTERFERENCE_COLLECTIVE, INTERFERENCE_COLLECTIVE_ALONE), 0)
        for op in ops:
            if op.start is None or op.end is None or op.span is not None:
                continue
            if op.name in count and op.kind.is_collective:
                calls[(op.name, count[op.name])].append(op)
                count[op.name] += 1
            elif op.name == INTERFERENCE_OVERLAPPED and count[INTERFERENCE_COLLECTIVE]:
                chain_end[(rank, count[INTERFERENCE_COLLECTIVE] - 1)] = op.end
    out = _Samples([], [])
    for (name, k), members in sorted(calls.items()):
        if len(members) != len(members[0].group):
            continue  # a partial trace: the collective's members are not all here
        start = max(m.start for m in members if m.start is not None)
        end = statistics.fmean(m.end for m in members if m.end is not None)
        if name == INTERFERENCE_COLLECTIVE_ALONE:
            out.alone.append(end - start)
        elif all(chain_end.get((r, k), -math.inf) >= m.end
                 for r, m in zip(members[0].group, members) if m.end is not None):
            out.beside.append(end - start)
        else:
            out.outlived += 1
    return out


def fit_interference(traces: Sequence[Trace]
                     ) -> tuple[InterferenceFit | None, InterferenceFit | None]:
    """comm_interference (from the probes) and compute_interference (from the collectives);
    None where the traces hold no such samples."""
    probes, colls = _Samples([], []), _Samples([], [])
    for trace in traces:
        for into, got in ((probes, probe_samples(trace)), (colls, collective_samples(trace))):
            into.alone += got.alone
            into.beside += got.beside
            into.outlived += got.outlived
    return (_ratio(probes, "probes", relative=False),
            _ratio(colls, "collectives", relative=True))


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
