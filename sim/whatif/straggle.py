"""Stragglers among time-shared CPU ranks: a collective waits for the member the host's
scheduler preempted last, not for the typical one.

    straggle = learn_straggle(captured.traces)
    gaps = with_straggle(ops, gaps, straggle)   # each collective's host gap + the wait

On a host whose cores are shared (`[cluster] cores`), a rank loses the core now and then for
a time slice. The capture shows it as each kernel's excess over its shape's median,
d = t - m, m the lower median (pooled over the capture's ranks, the shapes
`sim.whatif.book.shape_key` groups; the lower one, a time some op really took: two samples'
median is their mean, which would read one preemption as none). The model: preemptions hit
a running rank as a Poisson process of `rate` per second of its run, each costing one slice
of `slice_s`; both are fixed by the excesses' first two moments, slice = sum(d^2) / sum(d)
and rate = sum(d) / (slice * sum(t)) (a compound Poisson delay has mean rate*T*slice and
variance rate*T*slice^2). The mean delay
is already in each op's time (`Statistic.LOAD`'s factor spreads it); what the mean leaves
out is the wait at each synchronisation: over a run of T seconds since a rank's last
communication, the n members of a collective are late by slice * N_i, N_i independent
Poisson(rate * T) counts, and the collective starts at the last of them, so each member
waits slice * (E[max_i N_i] - rate * T) beyond the mean (`expected_max_count`: the order
statistic, exact). That wait goes into the collective's host gap: it delays the collective,
not the kernels issued after it. Point-to-point transfers end a run but add no wait, and an
asynchronous collective is taken as synchronising its stream's run (the DP buckets'
lateness is not carried from one to the next).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.stats import poisson

from sim.whatif.book import shape_key
from traces.ops import Op, OpKind, Trace


@dataclass(frozen=True, slots=True)
class Straggle:
    """A rank's preemptions: `rate` per second it runs, `slice_s` seconds each."""

    rate: float
    slice_s: float

    def wait(self, run_s: float, members: int) -> float:
        """Seconds a collective of `members` ranks, each having run `run_s` seconds since its
        last communication, waits beyond their mean lateness for the last one."""
        mean = self.rate * run_s
        if members < 2 or mean <= 0.0 or self.slice_s <= 0.0:
            return 0.0
        return self.slice_s * max(0.0, expected_max_count(mean, members) - mean)


NONE = Straggle(0.0, 0.0)
"""No preemption (a capture whose kernels of one shape all took the same time)."""


@lru_cache(maxsize=4096)
def expected_max_count(mean: float, members: int) -> float:
    """E[max of `members` independent Poisson(`mean`) counts] = sum over k >= 1 of
    (1 - P(N <= k-1)^members), summed to where the terms are below 1e-17 of the total (past
    mean + 12 sqrt(mean) + 40: a tail the Poisson leaves under e^-40)."""
    if mean <= 0.0:
        return 0.0
    ks = np.arange(0, math.ceil(mean + 12.0 * math.sqrt(mean) + 40.0))
    return float(np.sum(-np.expm1(members * poisson.logcdf(ks, mean))))


def learn_straggle(traces: Sequence[Trace]) -> Straggle:
    """The preemption rate and slice the captured kernels' excesses over their shapes'
    medians imply (module docstring); `NONE` where they show no excess."""
    durations: dict[tuple[object, ...], list[float]] = defaultdict(list)
    for trace in traces:
        for ops in trace.ops.values():
            for op in ops:
                if op.kind is OpKind.COMPUTE and op.start is not None and \
                        op.end is not None and op.span is None:
                    durations[shape_key(op)].append(op.end - op.start)
    excess = squares = total = 0.0
    for times in durations.values():
        median = statistics.median_low(times)
        excess += sum(t - median for t in times)
        squares += sum((t - median) ** 2 for t in times)
        total += sum(times)
    if not (excess > 0.0 and squares > 0.0 and total > 0.0):
        return NONE
    slice_s = squares / excess
    return Straggle(excess / (slice_s * total), slice_s)


def with_straggle(ops: Sequence[Op], gaps: Sequence[float], straggle: Straggle) -> list[float]:
    """`gaps` (a rank's timed ops' host gaps) with each collective's wait for its last member
    added: the run before it is the kernels' times and the host gaps since the rank's last
    communication op."""
    out = list(gaps)
    run = 0.0
    for i, op in enumerate(ops):
        if op.kind is OpKind.COMPUTE:
            if op.start is not None and op.end is not None:
                run += op.end - op.start
            run += gaps[i]
            continue
        if op.kind.is_collective:
            out[i] += straggle.wait(run + gaps[i], len(op.group))
        run = 0.0
    return out
