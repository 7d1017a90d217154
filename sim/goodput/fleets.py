"""Fleets as published: per-component failure rates, each fleet from one cited source.

`[reliability] fleet = "llama3-h100"` picks one; `[reliability.rates]` overrides it per
component. A rate is failures per instance-hour: a source's count of interruptions by cause,
over the instances that cause lives on (GPUs, hosts, NIC links) and the hours it counted.
Each interruption is counted once, under one component: a source's total is never added to
the parts it already contains.

* `llama3-h100` (the default for GPU clusters): Llama Team, "The Llama 3 Herd of Models",
  2024, §3.3.4 and Table 5: 419 unexpected interruptions and 47 planned ones in a 54-day
  snapshot of 405B pre-training on 16,384 H100s (2,048 hosts, one 400 Gb/s NIC per GPU).
  Every line of Table 5 checked against two independent transcriptions (DatacenterDynamics,
  2024-07; G. Lockwood's component-reliability notes); the 7 "NCCL Watchdog Timeouts" are the
  interruptions known to have hung (found by the watchdog, no other cause): the fleet's
  `hang_fraction`, 7 / 466 (a lower bound: other causes may have hung too).
* `rsc1`, `rsc2`: Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning
  Research Clusters", HPCA 2025 (arXiv:2410.21680): 6.50 (RSC-1, 16k A100) and 2.34 (RSC-2,
  8k A100) job-interrupting infrastructure failures per 1,000 node-days, counted per node
  (the paper's unit; the rate is put on the host). RSC-1 adds the lemon-node term below.
  (Checked in a detailed review of the paper, AI闲谈 2024; the arXiv text was not reachable.)
* `opt-a100`: Zhang et al., "OPT: Open Pre-trained Transformer Language Models", 2022, §2.5:
  "hardware failures contributed to at least 35 manual restarts and the cycling of over 100
  hosts over the course of 2 months" (and, the paper estimates, 70+ automatic restarts) on
  992 A100s (124 hosts of 8); every one on the host, the unit the paper counts. Verified.
* `bloom-a100`: BigScience, "The Technology Behind BLOOM Training" (S. Bekman, Hugging Face
  blog, 2022): "on average we were getting 1-2 GPU failures a week" on "about 400 GPUs"
  (384 in training on 48 nodes), 1.5 a week taken; the run kept 4 spare nodes (BLOOM paper,
  Le Scao et al. 2022, §3.4). Both verified.
* TPU: no published per-component TPU fleet rates were found; parasim refuses to guess (set
  `mtti` or `[reliability.rates]`).

MTTF against job size on RSC-1 (`sim.goodput.laws`). Kokolis et al. *measured* 47.7 days for
8-GPU jobs and 7.9 h for 1,024-GPU jobs; their 1.8 h at 16,384 GPUs (and 0.23 h at 131,072)
is a *projection*, 1 / (nodes x 6.50e-3 per node-day), not a measurement. The per-node rate
alone predicts 24 / (128 x 6.5e-3) = 28.8 h at 1,024 GPUs, 3.6x the measured 7.9 h.

The lemon-node term (`lemon`, per job-hour). Kokolis et al. trace job failures beyond the
per-node rate to lemon nodes, the few nodes that fail again and again and that a restarted
job of any size lands on. parasim models it as a hazard each job carries whatever its size:
1/7.9 h - 128 x 6.5e-3 / 24 h = 0.0919 per hour. It fits that one measurement (the
1,024-GPU MTTI is its input); at 16,384 GPUs it gives 1 / (2,048 x 6.5e-3 / 24 + 0.0919) =
1.55 h against the paper's projected 1.8 h (-14%), which it does not use. It is wrong for
small jobs: 10.9 h at 8 GPUs, against 47.7 days measured. Use `rsc1` for jobs of a thousand
GPUs and more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.goodput.laws import RSC1_PER_NODE_DAY, lemon_per_hour
from sim.goodput.rates import Component
from traces.errors import ConfigError

HOUR = 1.0


@dataclass(frozen=True, slots=True)
class Fleet:
    """A published fleet: its failures per instance-hour by component, and what it says."""

    name: str
    source: str
    rates_per_hour: dict[Component, float] = field(default_factory=dict)
    spare_nodes: int | None = None
    """Hot spares the source says the run kept (None where it says nothing)."""
    hang_fraction: float = 0.0
    """The share of its interruptions the source says hung (found by the watchdog)."""

    def rate(self, component: Component) -> float:
        return self.rates_per_hour.get(component, 0.0)


# Llama 3, Table 5 (counts in the 54-day snapshot), grouped by the instance each lives on.
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
LLAMA3_HOSTS = 2_048
LLAMA3_TABLE5 = {
    Component.GPU: {"Faulty GPU": 148, "GPU SRAM Memory": 19, "GPU System Processor": 17,
                    "Silent Data Corruption": 6, "GPU Thermal Interface + Sensor": 6},
    Component.HBM: {"GPU HBM3 Memory": 72},
    Component.CABLE: {"Network Switch/Cable": 35},  # one line in Table 5: put on the links
    Component.NIC: {"NIC": 7},
    Component.SOFTWARE: {"Software Bug": 54, "NCCL Watchdog Timeouts": 7, "Dependency": 2},
    Component.HOST: {"Host Maintenance": 32, "SSD": 3, "Power Supply": 3, "Server Chassis": 2,
                     "IO Expansion Board": 2, "CPU": 2, "System Memory": 2},
    Component.PLANNED: {"planned (automated maintenance)": 47},  # §3.3.4: 47 of 466
}
"""Every line of Table 5 (419 in all) and the 47 planned interruptions of §3.3.4."""
_PER_HOST = frozenset({Component.SOFTWARE, Component.HOST, Component.PLANNED})


def _llama3() -> dict[Component, float]:
    hours = LLAMA3_DAYS * 24 * HOUR
    return {c: sum(lines.values()) / ((LLAMA3_HOSTS if c in _PER_HOST else LLAMA3_GPUS) * hours)
            for c, lines in LLAMA3_TABLE5.items()}  # one NIC and one link per GPU


RSC2_PER_NODE_DAY = 2.34e-3
RSC1_LEMON_PER_HOUR = lemon_per_hour()
"""Fitted to Kokolis et al.'s measured 7.9 h MTTF of 1,024-GPU jobs (`sim.goodput.laws`)."""
LLAMA3_HANGS = LLAMA3_TABLE5[Component.SOFTWARE]["NCCL Watchdog Timeouts"]
LLAMA3_INTERRUPTIONS = sum(sum(lines.values()) for lines in LLAMA3_TABLE5.values())
OPT_HOSTS, OPT_HOSTS_CYCLED, OPT_DAYS = 124, 100, 60
BLOOM_GPUS, BLOOM_FAILURES_PER_WEEK, BLOOM_SPARES = 384, 1.5, 4

FLEETS: dict[str, Fleet] = {
    "llama3-h100": Fleet("llama3-h100", "Llama 3 (2024), Table 5", _llama3(),
                         hang_fraction=LLAMA3_HANGS / LLAMA3_INTERRUPTIONS),
    "rsc1": Fleet("rsc1", "Kokolis et al. (HPCA 2025), RSC-1",
                  {Component.HOST: RSC1_PER_NODE_DAY / 24,
                   Component.LEMON: RSC1_LEMON_PER_HOUR}),
    "rsc2": Fleet("rsc2", "Kokolis et al. (HPCA 2025), RSC-2",
                  {Component.HOST: RSC2_PER_NODE_DAY / 24}),
    "opt-a100": Fleet("opt-a100", "OPT (2022), §2.5",
                      {Component.HOST: OPT_HOSTS_CYCLED / (OPT_HOSTS * OPT_DAYS * 24)}),
    "bloom-a100": Fleet("bloom-a100", "BLOOM training (BigScience, 2022)",
                        {Component.GPU: BLOOM_FAILURES_PER_WEEK / (BLOOM_GPUS * 7 * 24)},
                        spare_nodes=BLOOM_SPARES),
}
FLEET_NAMES = tuple(FLEETS)
DEFAULT_GPU_FLEET = "llama3-h100"
"""The largest published H100 production fleet (16,384 GPUs)."""


def fleet_for(name: str | None, *, tpu: bool, by_hand: bool) -> Fleet:
    """The fleet a run uses: the named one, or the default for its accelerator. A TPU run
    with neither a fleet nor rates by hand is refused: no TPU source to take them from."""
    if name is not None:
        return FLEETS[name]
    if not tpu:
        return FLEETS[DEFAULT_GPU_FLEET]
    if by_hand:
        return Fleet("by-hand", "[reliability.rates]")
    raise ConfigError("reliability.fleet: no published TPU fleet failure rates to default to "
                      "(parasim does not guess); set [reliability] mtti or [reliability.rates]")
