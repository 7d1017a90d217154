"""A kernel that starts at the same instant as a transfer of its rank is beside it, whichever
stream the engine resumes first (`sim.engine.instant`, issue 33): its duration is the
interference model's closed form, and the step does not depend on the order of the ops."""

from __future__ import annotations

import pytest

from sim.engine.replay import replay
from sim.engine.transport import NetworkMode
from sim.models.compute import ComputeModel
from sim.models.interference import GpuInterference
from sim.models.sharing import gpu_interference
from sim.profile import default_profile
from topology import build_cluster
from traces.ops import Op, OpKind, Phase, Trace
from traces.purpose import Kernel, KernelRun

MiB = 2**20
H100 = build_cluster("dgx-h100", nodes=1)
MODEL = ComputeModel(H100.accelerator, default_profile(H100.accelerator))


def gpu() -> GpuInterference:
    model = gpu_interference(H100, MODEL)
    assert model is not None
    return model


def gemm(deps=(), m=8192) -> Op:
    return Op(kind=OpKind.COMPUTE, stream="compute", name="fc1", purpose=KernelRun(Kernel.FC1),
              phase=Phase.FWD, gemm=(1, m, 8192, 8192), deps=deps)


AR = Op(kind=OpKind.ALL_REDUCE, stream="comm", group=(0, 1), size_bytes=4096 * MiB)


@pytest.mark.parametrize("network", [NetworkMode.FLOW, NetworkMode.ANALYTIC])
@pytest.mark.parametrize("comm_first", [False, True])
def test_a_gemm_starting_with_a_collective_runs_on_the_sms_nccl_leaves(network, comm_first):
    """Both start at 0 on each rank; the GEMM takes shared_duration on units - comm_units SMs
    with the HBM left, not its time alone, in either op order."""
    model = gpu()
    ops = (AR, gemm()) if comm_first else (gemm(), AR)
    k = 1 if comm_first else 0
    times = replay(Trace({0: ops, 1: ops}), H100, MODEL, interference=model, network=network)
    op = ops[k]
    beside = MODEL.shared_duration(op, model.units - model.comm_units, model.hbm_left)
    assert beside > MODEL.duration(op)  # the test could fail: the stretch is real
    assert times.ends[0][1 - k] > beside  # the collective outlasts the GEMM
    for rank in (0, 1):
        assert times.starts[rank][k] == 0.0 == times.starts[rank][1 - k]
        assert times.ends[rank][k] == MODEL.duration(op) * model.kernel_scale(op)
        assert times.ends[rank][k] == pytest.approx(beside, rel=1e-12)


@pytest.mark.parametrize("comm_first", [False, True])
def test_a_run_of_kernels_starting_with_a_collective_is_stretched_kernel_by_kernel(comm_first):
    """A run (two GEMMs back to back, one timeout) that starts with the collective: each
    kernel its own closed form, the sums the engine takes when the rank is already busy."""
    model = gpu()
    run = (gemm(), gemm(m=4096))
    ops = (AR, *run) if comm_first else (*run, AR)
    first = 1 if comm_first else 0
    times = replay(Trace({0: ops, 1: ops}), H100, MODEL, interference=model)
    a, b = (MODEL.duration(op) * model.kernel_scale(op) for op in run)
    assert a > MODEL.duration(run[0]) and b > MODEL.duration(run[1])
    assert times.starts[0][first:first + 2] == [0.0, a]
    assert times.ends[0][first:first + 2] == [a, a + b]


def test_a_kernel_starting_as_a_transfer_ends_is_not_stretched():
    """A transfer is in flight over [start, end): a GEMM that starts at its end (after a
    measured kernel of exactly its length, which keeps its duration) runs alone, in either
    op order."""
    model = gpu()
    moving = replay(Trace({0: (AR,), 1: (AR,)}), H100, MODEL, interference=model).ends[0][0]
    waited = Op(kind=OpKind.COMPUTE, stream="compute", name="x", start=0.0, end=moving)
    for ops in ((waited, gemm(deps=(0,)), AR), (AR, waited, gemm(deps=(1,)))):
        times = replay(Trace({0: ops, 1: ops}), H100, MODEL, interference=model)
        k = 1 if ops[0] is waited else 2
        assert times.ends[0][2 if k == 1 else 0] == moving  # the collective ends then
        assert times.starts[0][k] == moving
        assert times.ends[0][k] == moving + MODEL.duration(ops[k])
