"""A kernel that starts at the same instant as a transfer of its rank is beside it, whichever
stream the engine resumes first (`sim.engine.instant`, issue 33): its duration is the
interference model's closed form, and the step does not depend on the order of the ops."""

from __future__ import annotations

import dataclasses

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


class Fixed:
    """Compute ops take the seconds in their `flops` field."""

    def duration(self, op):
        return op.flops


@dataclasses.dataclass(frozen=True)
class Triple:
    """Kernels beside communication take 3x (the engine's `Interference`, nothing else)."""

    kernel_stretch: float = 3.0
    comm_stretch: float = 1.0
    comm_wait_s: float = 0.0
    per_kernel: bool = False

    def kernel_scale(self, op):
        return self.kernel_stretch


def kernel(seconds, stream="c", deps=()):
    return Op(kind=OpKind.COMPUTE, stream=stream, name="x", flops=seconds, deps=deps)


def send_recv(size_bytes, deps):
    return (Op(kind=OpKind.SEND, stream="s", peer=1, size_bytes=size_bytes, tag="t", deps=deps),
            Op(kind=OpKind.RECV, stream="s", peer=0, size_bytes=size_bytes, tag="t", deps=deps))


@pytest.mark.parametrize("network", [NetworkMode.FLOW, NetworkMode.ANALYTIC])
@pytest.mark.parametrize("long", [False, True])
def test_a_kernel_runs_at_a_third_of_its_speed_while_a_transfer_is_in_flight(network, long):
    """A kernel of D seconds alone, started at 0; a transfer of c seconds from a = 1 ms (after
    a kernel on another stream): by a it has done a of its work, then 1/3 of a second's work per
    second until the transfer ends (or it does), then full speed again. `long`: it outlasts
    the transfer; else it ends inside it. The kernel on the other stream ran before: as is."""
    a = 1e-3
    send, recv = send_recv(64 * MiB, deps=(1,))
    alone = send_recv(64 * MiB, deps=())
    c = replay(Trace({0: (alone[0],), 1: (alone[1],)}), H100, Fixed(), network=network).ends[0][0]
    d = a + c if long else a + c / 6  # alone: past the transfer's end, or half way through
    plan = Trace({r: (kernel(d), kernel(a, stream="d"), moved)
                  for r, moved in ((0, send), (1, recv))})
    times = replay(plan, H100, Fixed(), interference=Triple(), network=network)
    expected = a + c + (d - a - c / 3) if long else a + (d - a) * 3
    for rank in (0, 1):
        assert times.ends[rank][1] == a
        assert times.starts[rank][2] == a
        assert times.ends[rank][2] == pytest.approx(a + c, rel=1e-12)
        assert times.ends[rank][0] == pytest.approx(expected, rel=1e-12)


def test_a_run_keeps_the_kernels_it_finished_and_slows_the_rest():
    """A run of three kernels (one timeout) of 1 ms each from 0; a transfer from 1.5 ms to the
    end: the first as alone, the second half done then 3x, the third 3x."""
    send, recv = send_recv(8e9, deps=(3,))
    run = (kernel(1e-3), kernel(1e-3), kernel(1e-3))
    plan = Trace({r: (*run, kernel(1.5e-3, stream="d"), moved)
                  for r, moved in ((0, send), (1, recv))})
    times = replay(plan, H100, Fixed(), interference=Triple())
    assert times.starts[0][4] == 1.5e-3
    assert times.ends[0][4] > 10e-3  # in flight past the run's end
    assert times.starts[0][:3] == [0.0, 1e-3, pytest.approx(1e-3 + 0.5e-3 + 1.5e-3)]
    assert times.ends[0][2] == pytest.approx(3e-3 + 3e-3, rel=1e-12)
