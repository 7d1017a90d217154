"""SMs that communication kernels hold for themselves beside compute (`[parallel] comm_sms`,
`traces.moe_overlap.comm_sms`): DeepSeek-V3 runs its all-to-all kernels on 20 of an H800's
132 SMs while the other micro-batch of an overlapped DualPipe pair computes (arXiv
2412.19437, sections 3.2.1-3.2.2), so that compute runs on the other 112.

A compute op is beside an expert all-to-all when, in its rank's program, it comes after
the all-to-all (on `ep_comm`) and before the compute op that waits for it: the pieces of the
other action of an overlapped pair (`traces.plan.moe_overlap`); an action alone waits for
its all-to-all at once, so none of its ops is beside one. Such an op takes the compute
model's time on units - comm_sms of the accelerator's units, at its full HBM bandwidth
(`ComputeModel.shared_duration`); every other op its own time. NCCL's transient SMs for
the rest of the communication stay the interference model's (`sim.models.sharing`).

Counted once (issue 33): the reservation is the all-to-all's share of the GPU, held for the
whole of each op beside it, so the interference model does not slow those ops again while
a transfer of their rank is in flight (`Spared`: their `kernel_scale` is 1); every other
op, the pieces of an action alone included, is slowed by it while its rank moves data, as
without a reservation. Megatron-Core's overlap_moe_comm with NCCL's all-to-all reserves
nothing (comm_sms 0 unless set): there the all-to-all's SMs and HBM are the interference
model's, for the time the all-to-all is in flight beside the other micro-batch's compute; with
DeepEP or HybridEP their kernels' fixed grid of SMs (`traces.moe_overlap.comm_sms`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.models.compute import ComputeModel
from sim.models.interference import Interference, interferes
from traces.ops import Op, OpKind, Stream, Trace
from traces.purpose import ExpertAllToAll


def beside_ep_comm(ops: tuple[Op, ...] | list[Op]) -> list[int]:
    """Indices of the compute ops beside an expert all-to-all (module docstring)."""
    out: list[int] = []
    open_a2a: set[int] = set()
    for i, op in enumerate(ops):
        if op.stream == Stream.EP_COMM and isinstance(op.purpose, ExpertAllToAll):
            open_a2a.add(i)
        elif op.kind is OpKind.COMPUTE and op.stream == Stream.COMPUTE and open_a2a:
            open_a2a.difference_update(op.deps)
            if open_a2a:
                out.append(i)
    return out


@dataclass(frozen=True)
class ReservedSms:
    """The compute model's durations, those of the ops in `beside` (by identity) on the SMs
    communication leaves."""

    compute: ComputeModel
    units: int
    beside: frozenset[int]
    """id() of the ops beside an all-to-all (the plan holds them, so no id is reused)."""

    def duration(self, op: Op) -> float:
        if id(op) in self.beside:
            return self.compute.shared_duration(op, self.units, 1.0)
        return self.compute.duration(op)


def reserved_sms(plan: Trace, compute: ComputeModel, comm_sms: int) -> ComputeModel | ReservedSms:
    """`compute` where comm_sms is 0 (or no op is beside an all-to-all), else `ReservedSms`
    over the plan's ops."""
    if not comm_sms:
        return compute
    beside = frozenset(id(ops[i]) for ops in plan.ops.values() for i in beside_ep_comm(ops))
    if not beside:
        return compute
    return ReservedSms(compute, compute.accelerator.compute_units - comm_sms, beside)


@dataclass(frozen=True)
class Spared:
    """`model`, but the ops of `beside` (by identity) are not slowed: their reserved SMs
    stand for the all-to-all's share already (module docstring)."""

    model: Interference
    beside: frozenset[int]

    @property
    def kernel_stretch(self) -> float:
        return self.model.kernel_stretch

    @property
    def comm_stretch(self) -> float:
        return self.model.comm_stretch

    @property
    def comm_wait_s(self) -> float:
        return self.model.comm_wait_s

    @property
    def per_kernel(self) -> bool:
        return True

    def kernel_scale(self, op: Op) -> float:
        return 1.0 if id(op) in self.beside else self.model.kernel_scale(op)


def spared(model: Interference, durations: ComputeModel | ReservedSms) -> Interference:
    """`model` as it applies beside the durations `reserved_sms` gave: `Spared` where some
    ops have reserved SMs and the model slows kernels, else `model` itself."""
    if not isinstance(durations, ReservedSms) or not interferes(model)[0]:
        return model
    return Spared(model, durations.beside)
