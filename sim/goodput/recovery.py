"""How a run recovers from a failure: `[reliability] recovery = "restart" | "in_memory" |
"elastic"`, and the work a failure loses, in closed form.

* restart (default): checkpoints go to storage (`sim.goodput.costs`); a failure requeues the
  job through the scheduler and reloads the last checkpoint from storage; a hardware failure
  waits for a spare node or a repair.
* in_memory: checkpoints go to host memory, each GPU's shard copied to its own host over PCIe
  (the stall) and on to a peer node's memory over the GPU's NIC (the drain, while training
  goes on), as GEMINI does (Wang et al., "GEMINI: Fast Failure Recovery in Distributed
  Training with In-Memory Checkpoints", SOSP 2023: checkpoints to CPU memory as often as every
  iteration without slowing training; recovery more than 13x faster than from remote
  storage). A restart reloads from memory: the replacement node fetches its shard from its
  peer over the NIC, the slowest load. Being cheap, the stall makes Daly's interval short, so
  a failure loses little work. (GEMINI falls back to storage when a node and its peer fail
  together; that rare case is left out.)
* elastic: in-memory checkpoints as above, and the job restarts in place on warm standby
  machines: no requeue through the scheduler, no wait for a repair or a spare (ByteRobust:
  Wan et al., "Robust LLM Training Infrastructure at ByteDance", arXiv:2509.16293, SOSP 2025:
  warm standbys, in-place restarts and in-memory checkpoints gave 97% effective training time
  over a three-month job on 9,600 GPUs). Process-group initialisation remains; detection
  is ByteRobust's: inspection threads polling network, GPU, host and training metrics every
  second find a failure, a hang included, in 10-30 s against the 10-30 minute timeouts it
  replaced (a summary of the paper; its own text was not reachable): 30 s, the slower end,
  for a crash and a hang alike, unless `detection` or `watchdog` is given.

Work lost per failure (closed form, for exponential failures of rate λ that strike compute):
cycles of c = τ + δ (compute, then the stall) whose checkpoint becomes durable d (the drain)
after its stall ends. A failure lands r into a cycle, with r's density λ e^{-λr} / (1 - e^{-λc})
on [0, c), and k ≥ 1 cycles after the last restart with probability e^{-λc}, independently;
it loses r, and one more cycle c when it strikes while the previous checkpoint drains (r < d,
k ≥ 1):

    E[lost] = 1/λ - c / (e^{λc} - 1) + c e^{-λc} (1 - e^{-λd}) / (1 - e^{-λc})
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sim.goodput.costs import Restart, host_copy_bandwidth
from sim.goodput.settings import Reliability
from sim.models.memory import MemoryBreakdown
from topology.cluster import Cluster

ELASTIC_DETECTION_S = 30.0
"""ByteRobust's detection, 10-30 s (module docstring): the slower end."""
PEER_LINKS = ("ib", "ici")
"""Link kinds a shard travels to a peer node's memory by."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpointing:
    """What one checkpoint costs under a recovery mode: its stall, and its write until it is
    durable (stall + drain)."""

    write_s: float
    stall_s: float


def peer_bandwidth(cluster: Cluster) -> float:
    """A GPU's link toward another node (its NIC; the host link where there is none)."""
    links = [c for c, k in zip(cluster.link_capacity, cluster.link_kind) if k in PEER_LINKS]
    return max(links) if links else host_copy_bandwidth(cluster)


def largest_shard(memory: list[MemoryBreakdown]) -> float:
    """Bytes of the largest shard one GPU checkpoints (its parameters and optimizer state)."""
    return max(m.params_bytes + m.optimizer_bytes for m in memory)


def in_memory_checkpoint(cluster: Cluster, memory: list[MemoryBreakdown]) -> Checkpointing:
    """GEMINI's checkpoint: the shard to host memory over PCIe (stall), then to a peer over
    the NIC (drain)."""
    shard = largest_shard(memory)
    stall = shard / host_copy_bandwidth(cluster)
    return Checkpointing(write_s=stall + shard / peer_bandwidth(cluster), stall_s=stall)


def recovered_restart(rel: Reliability, restart: Restart, cluster: Cluster,
                      memory: list[MemoryBreakdown]) -> Restart:
    """The restart's parts under `rel.recovery`: a load from a peer's memory (in_memory,
    elastic); no requeue, no repair wait and ByteRobust's detection (elastic)."""
    if rel.recovery == "restart":
        return restart
    load = largest_shard(memory) / peer_bandwidth(cluster)
    if rel.recovery == "in_memory":
        return replace(restart, load_s=load)
    return replace(restart, load_s=load, requeue_s=0.0, repair_s=0.0,
                   detection_s=(restart.detection_s if rel.detection_s is not None
                                else ELASTIC_DETECTION_S),
                   watchdog_s=(restart.watchdog_s if rel.watchdog_s is not None
                               else ELASTIC_DETECTION_S))


def expected_lost_s(cycle_s: float, drain_s: float, rate_per_s: float) -> float:
    """Expected work lost by a failure during compute (module docstring)."""
    lam_c = rate_per_s * cycle_s
    if lam_c < 1e-9:  # the limit λ → 0: half a cycle, plus a cycle when the drain is struck
        return cycle_s / 2 + drain_s
    r = 1.0 / rate_per_s - cycle_s / math.expm1(lam_c)
    return r + cycle_s * math.exp(-lam_c) * -math.expm1(-rate_per_s * drain_s) \
        / -math.expm1(-lam_c)
