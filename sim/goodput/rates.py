"""Failure rates per component and the job's mean time to interruption (MTTI).

A job is interrupted when any of its components fails: with independent exponential
failures, the job's rate is the sum over components of (rate per instance-hour) x (instances),
and MTTI = 1 / that sum. Instances come from the built cluster: GPUs and their HBM, hosts
(servers), NICs, the cables between NICs and their leaf switches, and the fabric's switches.

Default rates, per instance-hour (none taken from the Llama 3 report, which the benchmark
checks against):

* The job-level rate of infrastructure failures, 6.50 per 1,000 node-days, is that of Meta's
  RSC-1 research cluster (Kokolis et al., "Revisiting Reliability in Large-Scale Machine
  Learning Research Clusters", HPCA 2025, arXiv:2410.21680, 11 months, 150 M A100 GPU-hours);
  their projection of a 1.8 h MTTF for a 16,384-GPU job follows from it:
  24 h / (2,048 nodes x 6.5e-3) = 1.80 h. Per node-hour: 6.5e-3 / 24 = 2.708e-4.
* That node rate is split across a host's components by the shares of a production H200
  fleet's failures that Crusoe reported at GTC 2025 (via G. Lockwood's "component
  reliability" notes, ~205 failures in four months): GPU faults 19.5% + GPU host replacements
  41.5% = 61% to the GPUs; other host issues (CPU, memory...) 4.9% to the host; InfiniBand
  recoverable 4.9% + other 17% = 21.9% to the NICs; InfiniBand hardware 12.2% to the cables.
  Per GPU: 0.61 x 2.708e-4 / 8 GPUs = 2.065e-5 per GPU-hour, and so on, per instance.
* HBM: GPU memory errors that stop a job are ~30x rarer than GPU hardware errors by mean
  time between errors on NCSA's Delta (Cui et al., "Characterizing GPU Resilience and Impact
  on AI/HPC Systems", arXiv:2503.11901v1, finding (i)): gpu / 30.
* Fabric switches: Microsoft's study of 180,000 datacenter switches finds a 2% chance of a
  failure within 3 months of deployment (Singh et al., "Surviving switch failures in cloud
  datacenters", CCR 51(2), 2021): -ln(0.98) / (91.25 d x 24 h) = 9.2e-6 per switch-hour.
* Software: 0 by default. Crashes of the training code itself depend on that code; the fleet
  rates above count infrastructure. Set `[reliability.rates] software` per node-hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from topology.cluster import Cluster

NODE_RATE_PER_HOUR = 6.50e-3 / 24
"""Kokolis et al. 2025, RSC-1: 6.50 infrastructure failures per 1,000 node-days."""
GPUS_PER_NODE_STUDIED = 8
"""The fleets above are 8-GPU servers (RSC-1: DGX A100; Crusoe: HGX H200)."""
NICS_PER_NODE_STUDIED = 8
"""One compute-fabric NIC per GPU in those servers."""
MAX_RATE_PER_HOUR = 1.0
"""A component failing once an hour on average is a typo, not a measurement."""


class Component(StrEnum):
    GPU = "gpu"
    HBM = "hbm"
    HOST = "host"
    NIC = "nic"
    CABLE = "cable"
    SWITCH = "switch"
    SOFTWARE = "software"
    SDC = "sdc"
    """Silent data corruption, per GPU-hour: `[reliability] sdc_rate`, 0 by default."""


COMPONENT_NAMES = tuple(str(c) for c in Component if c is not Component.SDC)
"""The keys of `[reliability.rates]` (silent data corruption has its own keys)."""
SWITCH_KINDS = frozenset({"leaf", "spine"})
"""Graph node kinds of fabric switches (`topology.fabric`); NVSwitches belong to the host."""

_GPU = 0.61 * NODE_RATE_PER_HOUR / GPUS_PER_NODE_STUDIED
DEFAULT_RATES_PER_HOUR: dict[Component, float] = {
    Component.GPU: _GPU,                                                       # 2.065e-5
    Component.HBM: _GPU / 30,                                                  # 6.9e-7
    Component.HOST: 0.049 * NODE_RATE_PER_HOUR,                                # 1.33e-5
    Component.NIC: 0.219 * NODE_RATE_PER_HOUR / NICS_PER_NODE_STUDIED,         # 7.4e-6
    Component.CABLE: 0.122 * NODE_RATE_PER_HOUR / NICS_PER_NODE_STUDIED,       # 4.1e-6
    Component.SWITCH: -math.log(0.98) / (91.25 * 24),                          # 9.2e-6
    Component.SOFTWARE: 0.0,
    Component.SDC: 0.0,
}
"""Failures per instance-hour, each derived in the module docstring."""
HARDWARE = frozenset(set(Component) - {Component.SOFTWARE})
"""Causes that take a node out of the job until it is repaired or swapped for a spare."""


@dataclass(frozen=True, slots=True)
class Counts:
    """How many instances of each component a job runs on."""

    values: dict[Component, int]

    def __getitem__(self, component: Component) -> int:
        return self.values[component]


def component_counts(cluster: Cluster) -> Counts:
    """Instances of each component in the built cluster (the whole cluster is the job)."""
    kinds = [data.get("kind") for _, data in cluster.graph.nodes(data=True)]
    nics = sum(1 for k in kinds if k == "nic")
    switches = sum(1 for k in kinds if k in SWITCH_KINDS)
    hosts = cluster.num_servers
    return Counts({Component.GPU: cluster.num_devices, Component.HBM: cluster.num_devices,
                   Component.HOST: hosts, Component.NIC: nics,
                   Component.CABLE: nics,  # one cable from each NIC to its leaf switch
                   Component.SWITCH: switches, Component.SOFTWARE: hosts,
                   Component.SDC: cluster.num_devices})


def job_rates(rates: dict[Component, float], counts: Counts) -> dict[Component, float]:
    """Failures per second of the whole job, by cause: rate per instance-hour x instances."""
    return {c: rates[c] * counts[c] / 3600.0 for c in Component}


def mtti_s(per_cause: dict[Component, float]) -> float:
    """The job's mean time to interruption, 1 / (sum of its causes' rates), in seconds."""
    total = sum(per_cause.values())
    return math.inf if total <= 0 else 1.0 / total
