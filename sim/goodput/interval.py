"""The optimal checkpoint interval and the expected effective training fraction.

With checkpoint cost δ (the time training stops for one), restart R and mean time to
interruption M, for exponential failures that may strike at any time (during a checkpoint
and a restart too):

* Young (1974): τ = sqrt(2 δ M), to first order.
* Daly (2006, "A higher order estimate of the optimum checkpoint interval for restart dumps",
  FGCS 22(3), eq. 37): τ = sqrt(2 δ M) [1 + (1/3) sqrt(δ / 2M) + (1/9) (δ / 2M)] − δ for
  δ < 2M, and τ = M for δ ≥ 2M. R does not enter either. Daly's example: M = 24 h,
  δ = 5 min gives 116.7 min (Young: 120 min).
* The expected wall time of W seconds of compute in segments of τ, each followed by a
  checkpoint (Daly 2006, eq. 13, his "complete" model):
  T = M e^{R/M} (e^{(τ+δ)/M} − 1) per segment, summed over the segments (the last one holds
  what remains of W). The effective training fraction is W / T.
"""

from __future__ import annotations

import math


def young_interval(delta_s: float, mtti_s: float) -> float:
    """Young's first-order optimum, sqrt(2 δ M)."""
    return math.sqrt(2.0 * delta_s * mtti_s)


def daly_interval(delta_s: float, mtti_s: float) -> float:
    """Daly's higher-order optimum (M when δ ≥ 2M)."""
    if delta_s >= 2.0 * mtti_s:
        return mtti_s
    x = delta_s / (2.0 * mtti_s)
    return math.sqrt(2.0 * delta_s * mtti_s) * (1 + math.sqrt(x) / 3 + x / 9) - delta_s


def segment_time(work_s: float, delta_s: float, restart_s: float, mtti_s: float) -> float:
    """Expected wall time to finish one segment of `work_s` plus its checkpoint."""
    if math.isinf(mtti_s):
        return work_s + delta_s
    return mtti_s * math.exp(restart_s / mtti_s) * math.expm1((work_s + delta_s) / mtti_s)


def expected_wall_time(work_s: float, interval_s: float, delta_s: float, restart_s: float,
                       mtti_s: float) -> float:
    """Expected wall time for `work_s` of compute, checkpointing every `interval_s`."""
    full, rest = divmod(work_s, interval_s)
    total = full * segment_time(interval_s, delta_s, restart_s, mtti_s)
    if rest > 0:
        total += segment_time(rest, delta_s, restart_s, mtti_s)
    return total


def effective_fraction(work_s: float, interval_s: float, delta_s: float, restart_s: float,
                       mtti_s: float) -> float:
    """W / E[T]: the share of the wall time that advanced training."""
    return work_s / expected_wall_time(work_s, interval_s, delta_s, restart_s, mtti_s)
