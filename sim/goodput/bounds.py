"""The checks a goodput plan passes before the Monte-Carlo starts, where values that are each
in bounds make together a run that would never end, or a model that breaks down.

* A spare pool drains when hardware fails faster than the pool's nodes come back: by Little's
  law the nodes under repair average (hardware failures per second) x (repair seconds); when
  that reaches the pool's size, failures queue without bound and the run never ends.
* Daly's expected wall time grows as e^{R/M} e^{(tau + delta)/M}: a restart or a cycle many
  times the MTTI is a run that (almost) never finishes, and a float that overflows.
* A checkpoint is taken between steps, so the interval between two is at least one step.
"""

from __future__ import annotations

import math

from sim.goodput.montecarlo import Cause
from traces.errors import ConfigError

MAX_WALL_S = 100 * 365 * 86_400.0
"""A century: an expected wall time beyond it is a run that does not finish."""


def check_spares(causes: tuple[Cause, ...], spare_nodes: int, repair_s: float) -> None:
    """Refuse a spare pool that hardware failures drain (Little's law, module docstring)."""
    if spare_nodes == 0:
        return
    in_repair = sum(c.rate_per_s for c in causes if c.hardware) * repair_s
    if in_repair >= spare_nodes:
        raise ConfigError(
            f"reliability.spare_nodes: {spare_nodes:,} spare nodes, but hardware failures every "
            f"{repair_s / in_repair:,.0f} s on average with a {repair_s:,.0f} s repair keep "
            f"{in_repair:,.1f} nodes in repair (Little's law): the pool runs dry and the run "
            "never ends; add spares or shorten the repair")


def log_segment_time(work_s: float, delta_s: float, restart_s: float, mtti_s: float) -> float:
    """The natural log of Daly's expected time for one segment (`interval.segment_time`),
    computed without overflow."""
    x = (work_s + delta_s) / mtti_s
    return math.log(mtti_s) + restart_s / mtti_s + x + math.log(-math.expm1(-x))


def check_finishes(work_s: float, interval_s: float, delta_s: float, restart_s: float,
                   mtti_s: float) -> None:
    """Refuse a run whose expected wall time (Daly's model) exceeds a century."""
    if math.isinf(mtti_s):
        return
    segments = max(1.0, math.ceil(work_s / interval_s))
    log_wall = math.log(segments) + log_segment_time(min(interval_s, work_s), delta_s,
                                                     restart_s, mtti_s)
    if log_wall > math.log(MAX_WALL_S):
        raise ConfigError(
            f"reliability.restart: restarts of {restart_s:,.0f} s on average (repair "
            f"included) and cycles of {interval_s + delta_s:,.0f} s against a mean time to "
            f"interruption of {mtti_s:,.0f} s: the run is expected to take more than a "
            "century (e^(restart / MTTI) grows without bound); restart faster, or fail less")


def step_interval(interval_s: float, step_time_s: float, given: bool) -> float:
    """The interval between checkpoints, at least one step (a given one shorter is refused)."""
    if given and interval_s < step_time_s:
        raise ConfigError(f"reliability.checkpoint_interval: {interval_s:.3g} s is shorter "
                          f"than one step, {step_time_s:.3g} s: a checkpoint is taken "
                          "between steps")
    return max(interval_s, step_time_s)
