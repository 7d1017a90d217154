"""A run's goodput model from a simulated step, and what `parasim goodput` prints.

    summary, _ = predict(exp)
    run = plan_run(exp, summary, target_tokens=target)
    outcome = simulate_run(run.model, runs=run.runs, seed=run.seed)
    goodput_json(run, outcome)      # sim.goodput.outputs

`plan_run` gathers the step time and tokens/s (`sim.simulate.predict`), the per-rank memory
(`StepSummary.memory_by_pp_rank`, from `sim.models.memory`) for the checkpoint's size, the
cluster's component counts for the failure rates, the restart's parts, and Daly's interval;
it checks the values that only make sense together (a write longer than the MTTI).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sim.config import Experiment
from sim.goodput.bounds import check_finishes, check_spares, step_interval
from sim.goodput.causes import (
    GIVEN,
    default_spares,
    rates_per_hour,
    run_causes,
    run_fleet,
    sdc_checks,
)
from sim.goodput.costs import (
    Restart,
    checkpoint_bytes,
    host_copy_bandwidth,
    restart_parts,
    storage_bandwidth,
)
from sim.goodput.interval import daly_interval, effective_fraction, young_interval
from sim.goodput.montecarlo import RunModel
from sim.goodput.rates import Component, Counts, component_counts, job_rates
from sim.goodput.recovery import in_memory_checkpoint, recovered_restart
from sim.goodput.settings import Reliability, reliability_or_default
from sim.goodput.stragglers import Stragglers, straggler_cost
from sim.metrics import StepSummary
from sim.models.memory import MemoryBreakdown
from traces.errors import ConfigError

DAY_S = 86_400.0
MAX_DAYS = 3650.0
MAX_TOKENS = 1e16
"""10 quadrillion tokens: ~700x Llama 3's 15.6T."""
__all__ = ["GIVEN", "GoodputPlan", "plan_from", "plan_run", "target_tokens"]


@dataclass(frozen=True, kw_only=True)
class GoodputPlan:
    name: str
    cluster: str
    world: int
    nodes: int
    step_time_s: float
    tokens_per_s: float
    target_tokens: float
    counts: Counts
    rates_per_hour: dict[Component, float]
    mtti_s: float
    mtti_given: bool
    checkpoint_bytes: float
    checkpoint_write_s: float
    stall_s: float
    restart: Restart
    restart_s: float
    """The mean restart over the causes, weighted by rate (what Daly's model takes)."""
    interval_s: float
    interval_given: bool
    young_s: float
    daly_s: float
    fraction_at_optimum: float
    fraction_at_interval: float
    expected_wall_s: float
    reliability: Reliability
    """As given, with `spare_nodes` resolved (`spares_default` says when it was not given)."""
    model: RunModel
    fleet: str = ""
    spares_default: bool = False
    stragglers: Stragglers | None = None
    """Slow nodes' cost over the run and their eviction's (`sim.goodput.stragglers`)."""
    variability_s: float = 0.0
    """What per-rank variability adds to the step (inside `step_time_s`)."""

    @property
    def runs(self) -> int:
        return self.reliability.runs

    @property
    def seed(self) -> int:
        return self.reliability.seed


def target_tokens(days: float | None, tokens: float | None, tokens_per_s: float) -> float:
    """--tokens N, or --days D: the tokens D days of failure-free training process."""
    if days is not None and tokens is not None:
        raise ConfigError("--days, --tokens: give one target, not both")
    if tokens is not None:
        if not 0 < tokens <= MAX_TOKENS:  # NaN fails too
            raise ConfigError(f"--tokens: {tokens:g} must be above 0 and at most "
                              f"{MAX_TOKENS:g}")
        if tokens / tokens_per_s > MAX_DAYS * DAY_S:
            raise ConfigError(f"--tokens: {tokens:g} tokens at {tokens_per_s:,.0f} tokens/s "
                              f"take more than {MAX_DAYS:g} days of compute")
        return tokens
    days = 30.0 if days is None else days
    if not 0 < days <= MAX_DAYS:
        raise ConfigError(f"--days: {days:g} must be above 0 and at most {MAX_DAYS:g}")
    return days * DAY_S * tokens_per_s


def plan_run(exp: Experiment, summary: StepSummary, *, target: float) -> GoodputPlan:
    """Everything the Monte-Carlo and the report need, from one simulated step."""
    plan = plan_from(exp, step_time_s=summary.step_time_s, tokens_per_s=summary.tokens_per_s,
                     memory=summary.memory_by_pp_rank, target=target)
    cluster = exp.cluster
    return replace(plan, variability_s=summary.variability_s, stragglers=straggler_cost(
        cluster.variability, exp.layout, cluster.devices_per_server, nodes=cluster.num_servers,
        variability_s=summary.variability_s, step_time_s=summary.step_time_s,
        useful_s=plan.model.useful_s, restart_s=plan.restart.seconds(waits_for_repair=False)))


def plan_from(exp: Experiment, *, step_time_s: float, tokens_per_s: float,
              memory: list[MemoryBreakdown], target: float) -> GoodputPlan:
    """`plan_run` from a step's time, throughput and per-rank memory (what `parasim search`
    keeps of each simulated layout)."""
    rel = reliability_or_default(exp.reliability)
    cluster = exp.cluster
    counts = component_counts(cluster)
    fleet = run_fleet(rel, cluster)
    rates = rates_per_hour(rel, fleet)
    per_cause = job_rates(rates, counts)
    spikes = rel.loss_spike_rate_per_hour / 3600.0
    failing = 1.0 / rel.mtti_s if rel.mtti_s is not None else sum(per_cause.values())
    mtti = math.inf if failing + spikes <= 0 else 1.0 / (failing + spikes)
    size = checkpoint_bytes(exp.layout, memory)
    write = (rel.checkpoint_write_s if rel.checkpoint_write_s is not None
             else size / storage_bandwidth(cluster, rel))
    if rel.recovery != "restart":  # to a peer's host memory (sim.goodput.recovery)
        if rel.checkpoint_write_s is not None:
            raise ConfigError(f"reliability.checkpoint_write: a write to storage, but recovery "
                              f"= {rel.recovery!r} checkpoints to a peer's memory (priced "
                              "from PCIe and the NIC): set one or the other")
        write = in_memory_checkpoint(cluster, memory).write_s
    if write >= mtti:
        raise ConfigError(f"reliability.checkpoint_write: {write:,.0f} s is not shorter than "
                          f"the job's mean time to interruption, {mtti:,.0f} s: no checkpoint "
                          "would ever finish (write faster, or fail less)")
    largest = max(m.params_bytes + m.optimizer_bytes for m in memory)
    overlapped = rel.async_checkpoint or rel.recovery != "restart"
    stall = min(write, largest / host_copy_bandwidth(cluster)) if overlapped else write
    restart = recovered_restart(rel, restart_parts(
        cluster, rel, size_bytes=size, step_time_s=step_time_s), cluster, memory)
    causes = run_causes(rel, per_cause, restart)
    spares = rel.spare_nodes
    if spares is None:
        spares = (fleet.spare_nodes if fleet.spare_nodes is not None
                  else default_spares(causes, restart.repair_s))
    check_spares(causes, spares, restart.repair_s)
    total = sum(c.rate_per_s for c in causes)
    # Daly's R: the mean over causes; without spares a hardware failure waits for its repair;
    # the share that hangs waits for the watchdog
    repair = restart.repair_s if spares == 0 else 0.0
    hang = rel.hang_fraction if rel.hang_fraction is not None else fleet.hang_fraction
    restart_mean = (sum(c.rate_per_s * (c.restart_s + (repair if c.hardware else 0.0)
                                        + hang * c.hang_extra_s)
                        for c in causes) / total if total
                    else restart.seconds(waits_for_repair=False))
    checks = sdc_checks(rel)
    useful = target / tokens_per_s
    work = useful * (1 + checks[1] / checks[0]) if checks else useful
    young = young_interval(stall, mtti) if math.isfinite(mtti) else work
    daly = daly_interval(stall, mtti) if math.isfinite(mtti) else work
    drain = write - stall
    interval = step_interval(rel.checkpoint_interval_s or max(daly, drain), step_time_s,
                             rel.checkpoint_interval_s is not None)
    if interval < drain:
        raise ConfigError(f"reliability.checkpoint_interval: {interval:,.0f} s is shorter "
                          f"than the asynchronous write's drain, {drain:,.0f} s: a checkpoint "
                          "would start before the previous one is written")
    check_finishes(work, interval, stall, restart_mean, mtti)
    model = RunModel(useful_s=useful, work_s=work, interval_s=interval, stall_s=stall,
                     drain_s=drain, causes=causes, spare_nodes=spares,
                     repair_s=restart.repair_s, hang_fraction=hang)
    return GoodputPlan(
        name=exp.name, cluster=cluster.name, world=exp.layout.world, nodes=cluster.num_servers,
        step_time_s=step_time_s, tokens_per_s=tokens_per_s,
        target_tokens=target, counts=counts, rates_per_hour=rates, mtti_s=mtti,
        mtti_given=rel.mtti_s is not None, checkpoint_bytes=size, checkpoint_write_s=write,
        stall_s=stall, restart=restart, restart_s=restart_mean, interval_s=interval,
        interval_given=rel.checkpoint_interval_s is not None, young_s=young, daly_s=daly,
        fraction_at_optimum=useful / work * effective_fraction(work, max(daly, drain,
                                                                         step_time_s), stall,
                                                               restart_mean, mtti),
        fraction_at_interval=useful / work * effective_fraction(work, interval, stall,
                                                                restart_mean, mtti),
        expected_wall_s=work / effective_fraction(work, interval, stall, restart_mean, mtti),
        reliability=replace(rel, spare_nodes=spares, hang_fraction=hang), model=model,
        fleet=fleet.name, spares_default=rel.spare_nodes is None)

