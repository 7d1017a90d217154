"""Stragglers over a whole run: what slow nodes cost, and whether evicting them pays.

The step simulator's variability keys (`[cluster] jitter`, `slow_nodes`, `slow_factor`;
`sim.models.variability`) stretch every rank's kernels by the expected slowest-member factor
e, and the simulated step is longer than the ideal one by `variability_s`. That stretch has
two parts: the per-rank jitter alone (e_jitter, the same keys with `slow_nodes = 0`) and the
slow nodes on top. Kernels stretch in proportion, so the slow nodes' share of the step's
variability is taken in proportion to the stretch they add:

    slow_step_s = variability_s x (e - e_jitter) / (e - 1)

Over a run of S = useful compute / step time steps, keeping them costs slow_step_s x S of wall
time (x the job's GPUs in GPU-hours). Lin et al. ("Understanding Stragglers in Large Model
Training Using What-if Analysis", OSDI 2025, ByteDance's LLM jobs) find stragglers persistent
on a few machines, so they can be evicted: the job expects nodes x slow_nodes of them; found
in the first steps, they are swapped for spares together at a checkpoint, for one restart
without a repair wait (no work lost), and the run goes on at the jitter-only pace (the spares
screened before they join, as ByteRobust's stop-time checks do). Evicting pays when that
restart is shorter than what the slow nodes cost over the run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.models.variability import step_stretch
from topology.variability import Variability
from traces.layout import Layout


@dataclass(frozen=True, slots=True, kw_only=True)
class Stragglers:
    slow_nodes_expected: float
    """nodes x slow_nodes: slow nodes the job expects."""
    slow_step_s: float
    """What the slow nodes add to each step (module docstring)."""
    steps: float
    keep_s: float
    """Wall seconds the slow nodes cost over the run if kept."""
    keep_gpu_hours: float
    evict_s: float
    """One restart without a repair wait, at a checkpoint."""

    @property
    def evict(self) -> bool:
        """Whether evicting the slow nodes costs less than keeping them."""
        return self.evict_s < self.keep_s

    @property
    def saved_s(self) -> float:
        """Wall seconds eviction saves (0 when keeping is cheaper)."""
        return max(0.0, self.keep_s - self.evict_s)


def straggler_cost(v: Variability, layout: Layout, devices_per_server: int, *, nodes: int,
                   variability_s: float, step_time_s: float, useful_s: float,
                   restart_s: float) -> Stragglers | None:
    """The slow nodes' cost over the run and the eviction's; None without slow nodes."""
    if v.slow_nodes == 0 or v.slow_factor == 1:
        return None
    e = step_stretch(v, layout, devices_per_server)
    e_jitter = step_stretch(replace(v, slow_nodes=0.0), layout, devices_per_server)
    slow_step = variability_s * (e - e_jitter) / (e - 1) if e > 1 else 0.0
    steps = useful_s / step_time_s
    keep = slow_step * steps
    return Stragglers(slow_nodes_expected=nodes * v.slow_nodes, slow_step_s=slow_step,
                      steps=steps, keep_s=keep, keep_gpu_hours=keep * layout.world / 3600,
                      evict_s=restart_s)
