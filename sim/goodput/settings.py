"""The optional `[reliability]` table of a config: what the user sets, checked with bounds.

    [reliability]
    fleet = "llama3-h100"           # published per-component rates (sim.goodput.fleets)
    mtti = "24h"                    # the job's mean time to interruption, set directly
    checkpoint_write = "5min"       # default: checkpoint size / storage bandwidth
    storage_bandwidth = "2GB/s"     # per node (default) or, with storage_scope = "job", in all
    storage_scope = "node"          # node | job
    storage_ceiling = "2TB/s"       # the storage system's bandwidth, bounding the job's
    async_checkpoint = false        # training resumes while the write drains
    checkpoint_interval = "2h"      # compute between checkpoints (default: Daly's optimum)
    restart = "10min"               # default: the sum of the parts below
    detection = "10min"             # parts of a restart (see sim.goodput.costs)
    requeue = "2min"
    repair = "1h"
    pg_init_per_rank = "1ms"
    warmup_steps = 2
    spare_nodes = 16                # hot spares (default: the fleet's, or sim.goodput.spares)
    hang_fraction = 0.1             # failures that hang: found by the watchdog (default: fleet's)
    watchdog = "10min"              # the collective timeout that finds a hang
    loss_spike_rate = 1e-3          # loss spikes per job-hour of training
    rollback = "2h"                 # compute a spike rolls back beyond the last checkpoint
    sdc_rate = 0.0                  # silent data corruptions per GPU-hour
    sdc_check_interval = "1h"       # checks (only when a check key is given) find them;
    sdc_check_cost = "1min"
    seed = 0                        # of the Monte-Carlo
    runs = 200                      # Monte-Carlo runs
    recovery = "restart"            # restart | in_memory | elastic (sim.goodput.recovery)

    [reliability.rates]             # failures per instance-hour, overriding the defaults
    gpu = 2e-5                      # of sim.goodput.rates; any of its components

Absent keys take the defaults; `None` below means "derive it". Every value is bounded: a
duration is finite and not negative, a rate is in [0, 1] per hour, counts are integers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.goodput.fleets import FLEET_NAMES
from sim.goodput.rates import COMPONENT_NAMES, MAX_RATE_PER_HOUR, Component
from traces.errors import ConfigError, show
from traces.fields import Fields, check_number

DAY_S = 86_400.0
MAX_MTTI_S = 3650 * DAY_S  # ten years
MAX_DURATION_S = 30 * DAY_S  # a checkpoint, a restart or an interval longer than a month
MAX_RUNS = 10_000
MAX_SPARES = 65_536
MAX_WARMUP_STEPS = 10_000
SCOPES = ("node", "job")
RECOVERY_MODES = ("restart", "in_memory", "elastic")
KEYS = ("fleet", "mtti", "rates", "checkpoint_write", "storage_bandwidth", "storage_scope",
        "async_checkpoint", "checkpoint_interval", "restart", "detection", "requeue", "repair",
        "pg_init_per_rank", "warmup_steps", "spare_nodes", "sdc_rate", "sdc_check_interval",
        "sdc_check_cost", "seed", "runs", "storage_ceiling", "hang_fraction", "watchdog",
        "loss_spike_rate", "rollback", "recovery")


@dataclass(frozen=True, slots=True, kw_only=True)
class Reliability:
    """The `[reliability]` table, read; None where the value is derived."""

    fleet: str | None = None
    """A name of `sim.goodput.fleets.FLEETS`; None: the accelerator's default."""
    mtti_s: float | None = None
    rates_per_hour: dict[Component, float] = field(default_factory=dict)
    """Overrides of the fleet's rates, per component."""
    checkpoint_write_s: float | None = None
    storage_bandwidth_Bps: float | None = None
    storage_scope: str = "node"
    storage_ceiling_Bps: float | None = None
    async_checkpoint: bool = False
    checkpoint_interval_s: float | None = None
    restart_s: float | None = None
    detection_s: float | None = None
    requeue_s: float | None = None
    repair_s: float | None = None
    pg_init_per_rank_s: float | None = None
    warmup_steps: int | None = None
    spare_nodes: int | None = None
    hang_fraction: float | None = None
    """None: the fleet's (Llama 3: its 7 watchdog timeouts of 466 interruptions)."""
    watchdog_s: float | None = None
    loss_spike_rate_per_hour: float = 0.0
    rollback_s: float = 0.0
    sdc_rate_per_hour: float = 0.0
    sdc_check_interval_s: float | None = None
    sdc_check_cost_s: float | None = None
    seed: int = 0
    runs: int = 200
    recovery: str = "restart"


def read_reliability(table: object) -> Reliability:
    """The `[reliability]` table as a `Reliability`; a bad key or value is one line."""
    t = Fields.of(table, "reliability").known(KEYS)

    def duration(key: str, *, maximum: float = MAX_DURATION_S,
                 positive: bool = False) -> float | None:
        if key not in t:
            return None
        value = t.time(key, 0.0, maximum=maximum)
        if positive and value <= 0:
            raise ConfigError(f"{t.name(key)}: {show(t.table[key])} must be above 0 s")
        return value

    bandwidth = t.bandwidth("storage_bandwidth", 0.0) if "storage_bandwidth" in t else None
    sdc_rate = t.number("sdc_rate", 0.0, minimum=0.0, maximum=MAX_RATE_PER_HOUR,
                        unit=" per GPU-hour")
    out = Reliability(
        fleet=t.choice("fleet", None, FLEET_NAMES) if "fleet" in t else None,
        mtti_s=duration("mtti", maximum=MAX_MTTI_S, positive=True),
        rates_per_hour=_rates(t),
        checkpoint_write_s=duration("checkpoint_write"),
        storage_bandwidth_Bps=bandwidth,
        storage_scope=t.choice("storage_scope", "node", SCOPES),
        storage_ceiling_Bps=(t.bandwidth("storage_ceiling", 0.0) if "storage_ceiling" in t
                             else None),
        async_checkpoint=t.boolean("async_checkpoint", False),
        checkpoint_interval_s=duration("checkpoint_interval", positive=True),
        restart_s=duration("restart"),
        detection_s=duration("detection"),
        requeue_s=duration("requeue"),
        repair_s=duration("repair"),
        pg_init_per_rank_s=duration("pg_init_per_rank", maximum=1.0),
        warmup_steps=(t.integer("warmup_steps", 0, minimum=0, maximum=MAX_WARMUP_STEPS)
                      if "warmup_steps" in t else None),
        spare_nodes=(t.integer("spare_nodes", 0, minimum=0, maximum=MAX_SPARES)
                     if "spare_nodes" in t else None),
        hang_fraction=(t.number("hang_fraction", 0.0, minimum=0.0, maximum=1.0)
                       if "hang_fraction" in t else None),
        watchdog_s=duration("watchdog"),
        loss_spike_rate_per_hour=t.number("loss_spike_rate", 0.0, minimum=0.0,
                                          maximum=MAX_RATE_PER_HOUR, unit=" per hour"),
        rollback_s=duration("rollback") or 0.0,
        sdc_rate_per_hour=sdc_rate,
        sdc_check_interval_s=duration("sdc_check_interval", positive=True),
        sdc_check_cost_s=duration("sdc_check_cost"),
        seed=t.integer("seed", 0, minimum=0, maximum=2**32 - 1),
        runs=t.integer("runs", 200, minimum=1, maximum=MAX_RUNS),
        recovery=t.choice("recovery", "restart", RECOVERY_MODES),
    )
    if out.mtti_s is not None and out.rates_per_hour:
        raise ConfigError("reliability.mtti: set the job's MTTI or per-component rates "
                          "([reliability.rates]), not both")
    return out


def _rates(t: Fields) -> dict[Component, float]:
    if "rates" not in t:
        return {}
    rates = t.sub("rates").known(COMPONENT_NAMES)
    return {Component(key): check_number(value, rates.name(key), minimum=0.0,
                                         maximum=MAX_RATE_PER_HOUR, unit=" per hour")
            for key, value in rates.table.items()}


def reliability_or_default(value: Any) -> Reliability:
    """An experiment's reliability settings (the defaults where the config has none)."""
    return value if isinstance(value, Reliability) else Reliability()
