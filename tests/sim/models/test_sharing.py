"""Compute and communication share a GPU (`sim.models.interference.GpuInterference`, built by
`sim.models.sharing`): NCCL's SMs and HBM traffic from their counts, and what a kernel and
a collective beside each other then take, in closed form."""

from __future__ import annotations

from math import ceil

import pytest

from sim.models.compute import ComputeModel
from sim.models.interference import NO_INTERFERENCE, GpuInterference, HostInterference
from sim.models.sharing import REDUCTION_HBM_PASSES, gpu_interference, interference_for
from sim.profile import default_profile
from topology import build_cluster
from traces.ops import Op, OpKind, Phase
from traces.purpose import Kernel, KernelRun

A100 = build_cluster("dgx-a100", nodes=1)
MODEL = ComputeModel(A100.accelerator, default_profile(A100.accelerator))
LAUNCH = default_profile(A100.accelerator).compute.launch_overhead_s


def gpu(cluster=A100) -> GpuInterference:
    model = gpu_interference(cluster, ComputeModel(cluster.accelerator,
                                                   default_profile(cluster.accelerator)))
    assert model is not None
    return model


def test_nccl_holds_one_sm_per_channel_and_moves_three_bytes_per_link_byte():
    one = gpu()
    server = A100.fabric.server  # type: ignore[attr-defined]
    # one DGX A100: 24 channels (NCCL's 12 searched rings, doubled); NVLink at its data rate
    assert (one.units, one.comm_units) == (108, 24)
    assert one.comm_hbm_Bps == REDUCTION_HBM_PASSES * server.nvlink_Bps * \
        server.nvlink_efficiency
    assert one.hbm_Bps == A100.accelerator.sustained_hbm_Bps
    many = gpu(build_cluster("dgx-a100", nodes=4))  # across nodes: 16 channels, the NICs
    assert many.comm_units == 16
    assert many.comm_hbm_Bps == pytest.approx(3 * 25e9 * 0.96)
    assert gpu(build_cluster("dgx-h100", nodes=1)).comm_units == 24


def test_a_gemm_beside_communication_runs_on_the_sms_nccl_leaves():
    model = gpu()
    assert model.kernel_stretch == 108 / 84
    # 8192^3 in 256x128 tiles: 2048 tiles, 19 waves on 108 SMs, 25 on 84 (same tile shape wins)
    op = Op(kind=OpKind.COMPUTE, stream="compute", name="fc1", purpose=KernelRun(Kernel.FC1),
            phase=Phase.FWD, gemm=(1, 8192, 8192, 8192))
    per_sm = A100.accelerator.sustained_flops / 108 * MODEL.profile.compute.gemm_efficiency

    def best(units):  # the library's best tile, by tile and wave count on `units` SMs
        return min(ceil(ceil(8192 / tm) * ceil(8192 / tn) / units) * 2 * tm * tn * 8192 / per_sm
                   for tm, tn in MODEL.profile.compute.gemm_tiles)

    assert best(108) == ceil(2048 / 108) * 2 * 256 * 128 * 8192 / per_sm  # 19 waves
    assert MODEL.duration(op) == pytest.approx(best(108) + LAUNCH, rel=1e-12)
    assert model.kernel_scale(op) == pytest.approx((best(84) + LAUNCH) / (best(108) + LAUNCH),
                                                   rel=1e-12)
    assert 1.2 < model.kernel_scale(op) < 1.35  # near 108/84, wave quantization aside


def test_a_streaming_kernel_beside_communication_gets_the_hbm_bandwidth_left():
    model = gpu()
    op = Op(kind=OpKind.COMPUTE, stream="compute", name="ln1", purpose=KernelRun(Kernel.LN1),
            phase=Phase.FWD, mem_bytes=1e9)
    memory = 1e9 / (A100.accelerator.sustained_hbm_Bps * 0.8)
    left = 1 - model.comm_hbm_Bps / model.hbm_Bps
    assert model.kernel_scale(op) == pytest.approx((memory / left + LAUNCH) / (memory + LAUNCH),
                                                   rel=1e-12)
    measured = Op(kind=OpKind.COMPUTE, stream="compute", name="ln1", start=0.0, end=1e-3,
                  mem_bytes=1e9)
    assert model.kernel_scale(measured) == 1.0  # a measured kernel keeps its time


def test_communication_beside_a_kernel_slows_only_past_half_the_hbm():
    model = gpu()
    assert model.comm_hbm_Bps < model.hbm_Bps / 2 and model.comm_stretch == 1.0
    heavy = GpuInterference(units=108, comm_units=24, hbm_Bps=2e12, comm_hbm_Bps=1.5e12,
                            compute=MODEL)
    assert heavy.comm_stretch == 1.5e12 / 1e12  # max-min: half of the HBM, not its demand
    assert heavy.comm_wait_s == 0.0 and heavy.per_kernel


def test_each_cluster_gets_its_own_model():
    localhost = build_cluster("localhost", gpus_per_node=2)
    profile = default_profile(localhost.accelerator)
    assert isinstance(interference_for(localhost, profile, ComputeModel(
        localhost.accelerator, profile)), HostInterference)
    assert isinstance(interference_for(A100, MODEL.profile, MODEL), GpuInterference)
    tpu = build_cluster("tpu-v4", nodes=16)  # ICI moves data on DMA engines of its own
    tpu_profile = default_profile(tpu.accelerator)
    assert interference_for(tpu, tpu_profile, ComputeModel(tpu.accelerator, tpu_profile)) \
        is NO_INTERFERENCE
