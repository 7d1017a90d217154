"""What a checkpoint and a restart cost: the checkpoint's size from the memory model, its
write (and, asynchronous, its stall), and a restart's parts.

Checkpoint size: the parameters and optimizer state of every rank, as `sim.models.memory`
holds them, each distinct shard counted once. A stage's tp x cp x dp ranks hold its state;
parameters are replicated over cp and, below ZeRO-3, over dp; the optimizer state over cp
and, at ZeRO-0, over dp. So per stage: ranks x (params / replicas + optimizer / replicas),
summed over the stages. Gradients are not saved (they are rebuilt by the next step).

Write: the size over the storage bandwidth, per node (`storage_scope = "node"`: every node
writes its share at once) or for the whole job, and at most `storage_ceiling` in all (the
storage system's own bandwidth: Llama 3's Tectonic sustains 2 TB/s, peaks at 7 TB/s, §3.3.1).
Default 1.94 GB/s per node: the DGX SuperPOD
reference architecture's storage guideline of 62 GB/s aggregate write per 32-node scalable
unit ("better" tier; NVIDIA DGX SuperPOD Reference Architecture, storage section). An
asynchronous checkpoint stalls training only for the copy of a GPU's largest share to host
memory over its PCIe link (the cluster's own link bandwidth); the write drains meanwhile.

Restart = detection + rescheduling + process-group initialisation + checkpoint load +
warm-up, each a default that `[reliability]` may replace:
* detection, 600 s: a failure is found after `detection`, or, when it hangs (`hang_fraction`
  of them), after the `watchdog` timeout (600 s by default: the same as below). A hang
  waits for PyTorch's NCCL watchdog, whose default timeout is
  10 minutes (`torch.distributed.constants.default_pg_nccl_timeout`, ProcessGroupNCCL's
  kProcessGroupNCCLDefaultTimeout); a crash is found sooner, so this is the upper case.
* requeue, 120 s: the scheduler cancels and requeues the job on healthy nodes (an assumption
  of parasim's, not a measurement: set yours).
* repair, 3600 s: without a hot spare, a hardware failure waits for its node's repair;
  Schroeder & Gibson (DSN 2006) find mean repair times from under an hour to over a day
  across LANL's systems: the lower end. With `spare_nodes`, a spare takes its place.
* process-group initialisation grows with the world: the rendezvous of every rank through
  one TCP store, which serves its ranks' requests one at a time: world x 1 ms per rank
  (derived; 16 s at 16,384 ranks).
* load: the checkpoint read back at the write's bandwidth.
* warm-up: 2 steps of the simulated step time (the first steps after a start allocate,
  autotune and fill the pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.goodput import badput
from sim.goodput.settings import Reliability
from sim.models.memory import MemoryBreakdown
from topology.cluster import Cluster
from traces.layout import Layout

STORAGE_BANDWIDTH_PER_NODE_BPS = 62e9 / 32
"""DGX SuperPOD RA storage guideline: 62 GB/s aggregate write per 32-node SU."""
DETECTION_S = 600.0
"""PyTorch ProcessGroupNCCL's default watchdog timeout, 10 min."""
REQUEUE_S = 120.0
REPAIR_S = 3600.0
PG_INIT_PER_RANK_S = 1e-3
WARMUP_STEPS = 2


def checkpoint_bytes(layout: Layout, memory: list[MemoryBreakdown]) -> float:
    """Bytes of one checkpoint: each distinct shard of parameters and optimizer state of
    every rank, from the memory model's per-rank values (see the module docstring)."""
    assert len(memory) == layout.pp, "one breakdown per pipeline rank"
    ranks = layout.tp * layout.cp * layout.dp  # per stage
    param_replicas = layout.cp * (1 if layout.zero >= 3 else layout.dp)
    optim_replicas = layout.cp * (layout.dp if layout.zero == 0 else 1)
    return sum(ranks * (m.params_bytes / param_replicas + m.optimizer_bytes / optim_replicas)
               for m in memory)


def storage_bandwidth(cluster: Cluster, rel: Reliability) -> float:
    """Bytes/s the job writes a checkpoint at, in all."""
    per = rel.storage_bandwidth_Bps or STORAGE_BANDWIDTH_PER_NODE_BPS
    job = per * cluster.num_servers if rel.storage_scope == "node" else per
    return job if rel.storage_ceiling_Bps is None else min(job, rel.storage_ceiling_Bps)


def host_copy_bandwidth(cluster: Cluster) -> float:
    """A GPU's link to host memory (the fastest PCIe link; HBM bandwidth where none)."""
    pcie = [c for c, k in zip(cluster.link_capacity, cluster.link_kind) if k == "pcie"]
    return max(pcie) if pcie else cluster.accelerator.hbm_bandwidth_Bps


@dataclass(frozen=True, slots=True, kw_only=True)
class Restart:
    """A restart's parts, seconds; `repair_s` is paid only by a hardware failure without a
    spare node."""

    detection_s: float
    requeue_s: float
    repair_s: float
    pg_init_s: float
    load_s: float
    warmup_s: float
    fixed_s: float | None = None
    """`[reliability] restart`: the whole restart, set by the user (the parts unused)."""
    watchdog_s: float = DETECTION_S
    """A hang's detection, in place of `detection_s`."""

    def seconds(self, *, waits_for_repair: bool) -> float:
        if self.fixed_s is not None:
            return self.fixed_s
        return (self.detection_s + self.requeue_s + self.pg_init_s + self.load_s
                + self.warmup_s + (self.repair_s if waits_for_repair else 0.0))

    def phases(self, wasted_s: float = 0.0) -> badput.Phases:
        """The restart without a repair wait, part by part in badput's categories, after
        `wasted_s` of work that is lost before the failure is seen."""
        first = ((badput.WASTED, wasted_s),) if wasted_s else ()
        if self.fixed_s is not None:
            return (*first, (badput.OTHER, self.fixed_s))
        return (*first, (badput.INFRASTRUCTURE, self.detection_s + self.requeue_s),
                (badput.INITIALIZATION, self.pg_init_s), (badput.RESTORE, self.load_s),
                (badput.STARTUP, self.warmup_s))


def restart_parts(cluster: Cluster, rel: Reliability, *, size_bytes: float,
                  step_time_s: float) -> Restart:
    """The parts of a restart, from the settings or their defaults."""
    bandwidth = storage_bandwidth(cluster, rel)
    per_rank = (rel.pg_init_per_rank_s if rel.pg_init_per_rank_s is not None
                else PG_INIT_PER_RANK_S)
    steps = rel.warmup_steps if rel.warmup_steps is not None else WARMUP_STEPS
    return Restart(
        detection_s=rel.detection_s if rel.detection_s is not None else DETECTION_S,
        requeue_s=rel.requeue_s if rel.requeue_s is not None else REQUEUE_S,
        repair_s=rel.repair_s if rel.repair_s is not None else REPAIR_S,
        pg_init_s=cluster.num_devices * per_rank,
        load_s=size_bytes / bandwidth,
        warmup_s=steps * step_time_s,
        fixed_s=rel.restart_s,
        watchdog_s=rel.watchdog_s if rel.watchdog_s is not None else DETECTION_S)
