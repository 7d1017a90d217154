"""Failure rates per component and the job's mean time to interruption (MTTI).

A job is interrupted when any of its components fails: with independent exponential
failures, the job's rate is the sum over components of (rate per instance-hour) x (instances),
and MTTI = 1 / that sum. Instances come from the built cluster: GPUs and their HBM, hosts
(servers), NICs, the cables between NICs and their leaf switches, and the fabric's switches;
software crashes and planned maintenance count per host, the lemon-node hazard once per job.

The rates themselves are a published fleet's (`sim.goodput.fleets`), or given by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from topology.cluster import Cluster

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
    PLANNED = "planned"
    """Planned maintenance, per host-hour: the job stops, no node waits for a repair."""
    LEMON = "lemon"
    """A hazard each job carries whatever its size (lemon nodes; `sim.goodput.fleets`)."""
    SDC = "sdc"
    """Silent data corruption, per GPU-hour: `[reliability] sdc_rate`, 0 by default."""


COMPONENT_NAMES = tuple(str(c) for c in Component if c is not Component.SDC)
"""The keys of `[reliability.rates]` (silent data corruption has its own keys)."""
SWITCH_KINDS = frozenset({"leaf", "spine"})
"""Graph node kinds of fabric switches (`topology.fabric`); NVSwitches belong to the host."""
HARDWARE = frozenset(set(Component) - {Component.SOFTWARE, Component.PLANNED})
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
                   Component.PLANNED: hosts, Component.LEMON: 1,
                   Component.SDC: cluster.num_devices})


def job_rates(rates: dict[Component, float], counts: Counts) -> dict[Component, float]:
    """Failures per second of the whole job, by cause: rate per instance-hour x instances."""
    return {c: rates.get(c, 0.0) * counts[c] / 3600.0 for c in Component}


def mtti_s(per_cause: dict[Component, float]) -> float:
    """The job's mean time to interruption, 1 / (sum of its causes' rates), in seconds."""
    total = sum(per_cause.values())
    return math.inf if total <= 0 else 1.0 / total
