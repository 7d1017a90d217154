"""Which interference model a cluster gets (`sim.models.interference`), from its figures.

    interference = interference_for(cluster, profile, compute)
    replay(plan, cluster, compute, interference=interference)

A profile that states a host's figures (the CPU of `localhost`, or a calibrated one) gets
`HostInterference`. A GPU cluster NCCL runs on gets `GpuInterference` from two counts:

  - the SMs NCCL's kernels hold: one CTA per channel, NCCL's channels for the cluster's ranks
    (`NcclSystem.comm_channels`: 24 in one DGX A100, 16 across 8-NIC nodes; an H100
    ncclAllGather launches 24 blocks, NVIDIA developer forum "Compute-communication overlap
    causes severe GEMM performance degradation because of tail effect");
  - the HBM traffic they make: a ring reduction writes each byte it receives, reads it back
    and reads the local byte it adds: 3 x the per-GPU rate of the links the communication
    beside compute crosses (the NICs across nodes, where DP, PP and ZeRO traffic goes;
    NVLink within one node), at their data efficiency.

Everything else (a TPU's ICI runs on DMA engines of its own; a hand-built cluster) gets none.
Measured: overlapping collectives slows GEMMs by 18.9% on average, 40% at most, on 4 A100s or
H100s (Lee et al., "Characterizing Compute-Communication Overlap in GPU-Accelerated
Distributed Deep Learning", arXiv 2507.03114); this model's GEMM figure within one node is
108/84 = 1.29 on A100 and 132/108 = 1.22 on H100, across nodes 1.17 and 1.14.
"""

from __future__ import annotations

from sim.collectives.nccl_system import system_for
from sim.models.compute import ComputeModel
from sim.models.interference import (
    NO_INTERFERENCE,
    GpuInterference,
    Interference,
    host_interference,
)
from sim.profile import Profile
from topology.cluster import Accelerator, Cluster
from traces.errors import ConfigError

REDUCTION_HBM_PASSES = 3
"""HBM accesses per byte a ring reduction receives: written, read back, the local one read."""


def interference_for(cluster: Cluster, profile: Profile, compute: ComputeModel) -> Interference:
    """The interference model of `cluster` timed by `profile` (module docstring)."""
    host = host_interference(profile)
    if host is not NO_INTERFERENCE:
        return host
    gpu = gpu_interference(cluster, compute)
    return NO_INTERFERENCE if gpu is None else gpu


def check_comm_sms(comm_sms: int, accelerator: Accelerator) -> None:
    """Refuse a parallel.comm_sms (`sim.models.reserved_sms`) that leaves compute no SM of
    the accelerator (checked before the cluster is built)."""
    units = accelerator.compute_units
    if comm_sms >= units:
        raise ConfigError(f"parallel.comm_sms: {comm_sms} must be below the {units} SMs of "
                          f"the {accelerator.name} (compute needs some)")


def gpu_interference(cluster: Cluster, compute: ComputeModel) -> GpuInterference | None:
    """NCCL's SMs and HBM traffic on `cluster`'s GPUs; None where NCCL does not run."""
    server = getattr(cluster.fabric, "server", None)
    if server is None or server.link_kind != "nvlink" or not server.nvlink_Bps:
        return None
    try:
        nccl = system_for(cluster, tuple(range(cluster.num_devices)))
    except ConfigError:  # an accelerator NCCL's model does not know
        return None
    acc = cluster.accelerator
    if cluster.num_servers > 1:
        link = server.nic_Bps * server.nics / server.gpus * server.nic_efficiency
    else:
        link = server.nvlink_Bps * server.nvlink_efficiency
    check_hbm(acc.sustained_hbm_Bps, REDUCTION_HBM_PASSES * link,
              "NIC" if cluster.num_servers > 1 else "NVLink")
    return GpuInterference(units=acc.compute_units, comm_units=nccl.comm_channels,
                           hbm_Bps=acc.sustained_hbm_Bps,
                           comm_hbm_Bps=REDUCTION_HBM_PASSES * link, compute=compute)


def check_hbm(hbm_Bps: float, comm_hbm_Bps: float, links: str) -> None:
    """Refuse an HBM no faster than the traffic NCCL's reductions make in it: the links would
    then outrun the memory they read and write, which no GPU is built to do (A100: 1.6-2 TB/s
    of HBM for 300 GB/s of NVLink a direction; H100: 3.35 TB/s for 450 GB/s)."""
    if comm_hbm_Bps >= hbm_Bps:
        raise ConfigError(
            f"cluster.hbm_bandwidth: {hbm_Bps / 1e9:,.4g} GB/s must be above the "
            f"{comm_hbm_Bps / 1e9:,.4g} GB/s NCCL's reductions move through HBM on this "
            f"cluster ({REDUCTION_HBM_PASSES} x the {links} data rate per GPU)")
