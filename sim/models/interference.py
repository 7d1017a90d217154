"""How compute and communication on one rank slow each other: a cost model beside the compute
model (`sim.models.compute`), asked by the replay engine (`sim.engine.replay`) through
`Interference`.

    interference = interference_for(cluster, profile, compute)   # sim.models.sharing
    replay(plan, cluster, compute, interference=interference)

What the engine asks:
  - `kernel_scale(op)`: a kernel does its work this many times slower while its rank has a
    transfer in flight (1: no effect), and at its own speed the rest of its time: the engine
    times it again whenever its rank starts or stops moving data, a transfer that starts at
    the kernel's own instant included (`sim.engine.running`); `kernel_stretch` is its value
    for a GEMM, and `per_kernel` says whether it depends on the kernel at all (else
    `kernel_stretch` it is);
  - `comm_wait_s`, `comm_stretch`: communication that starts while one of its ranks runs a
    kernel first waits `comm_wait_s`, then takes `comm_stretch` times as long (each latency
    and byte).
On a CPU host, gloo's threads share the cores the kernels run on (`HostInterference`, built
from the profile's comm_interference, compute_interference and compute_interference_delay_s,
fitted by `sim.calibrate.interference`). On a GPU (`GpuInterference`), NCCL's kernels hold SMs
(one per channel) and HBM bandwidth while they run: a kernel beside them runs on the other SMs
with the HBM bandwidth they leave, and communication beside a kernel gets its max-min share
of HBM (docs/sustained-rates.md, "Compute and communication share the GPU"). A GEMM chunk of
Transformer Engine's overlap already runs on the SMs its own collective leaves it (its
duration's, `ComputeModel.math_units`), so that collective marks no rank busy here
(`traces.plan.overlap.in_margin`) and NCCL's SMs beside it come off those. Where a
DualPipe pair reserves SMs for its all-to-all (`sim.models.reserved_sms`), the ops beside it
are timed on the SMs left and this model leaves them alone (`Spared`): counted once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sim.models.compute import ComputeModel
from sim.profile import Profile
from traces.ops import Op


class Interference(Protocol):
    """What the engine asks about compute and communication sharing a rank."""

    @property
    def kernel_stretch(self) -> float:
        """How many times as long a kernel takes while its rank moves data (1: no effect)."""
        ...

    @property
    def comm_stretch(self) -> float:
        """How many times as long communication takes (each latency and byte) that starts
        while one of its ranks runs a kernel (1: no effect)."""
        ...

    @property
    def comm_wait_s(self) -> float:
        """How long such communication first waits (0: none)."""
        ...

    @property
    def per_kernel(self) -> bool:
        """Whether `kernel_scale` depends on the kernel (else it is `kernel_stretch`)."""
        ...

    def kernel_scale(self, op: Op) -> float:
        """How many times as long compute op `op` takes while its rank moves data."""
        ...


@dataclass(frozen=True, slots=True)
class NoInterference:
    """Compute and communication do not notice each other (a GPU: NCCL has SMs of its own)."""

    kernel_stretch: float = 1.0
    comm_stretch: float = 1.0
    comm_wait_s: float = 0.0
    per_kernel: bool = False

    def kernel_scale(self, op: Op) -> float:
        return 1.0


NO_INTERFERENCE = NoInterference()
"""The default of the engine."""


@dataclass(frozen=True, slots=True)
class HostInterference:
    """A host whose cores run both the kernels and the threads that move the data (gloo on a
    CPU): the profile's figures (`sim.profile.ComputeParams`)."""

    comm_interference: float
    """Kernels beside communication take (1 + this) times as long."""
    compute_interference: float
    """Communication that starts beside a kernel takes (1 + this) times as long ..."""
    compute_interference_delay_s: float
    """... after first waiting this long (for a core)."""

    @classmethod
    def of(cls, profile: Profile) -> HostInterference:
        c = profile.compute
        return cls(c.comm_interference, c.compute_interference, c.compute_interference_delay_s)

    @property
    def kernel_stretch(self) -> float:
        return 1.0 + self.comm_interference

    @property
    def comm_stretch(self) -> float:
        return 1.0 + self.compute_interference

    @property
    def comm_wait_s(self) -> float:
        return self.compute_interference_delay_s

    @property
    def per_kernel(self) -> bool:
        return False

    def kernel_scale(self, op: Op) -> float:
        return self.kernel_stretch


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInterference:
    """A GPU whose NCCL kernels hold `comm_units` of its `units` SMs (one CTA per channel)
    and move `comm_hbm_Bps` through HBM while communication is in flight:

        a kernel beside it     runs on units - comm_units SMs (the compute model's tile and
                               wave count on them) with hbm - comm_hbm of the bandwidth
        communication beside   gets its max-min share of HBM against a kernel that wants all
        a kernel               of it: slowed only where it needs more than half,
                               comm_stretch = max(1, comm_hbm / (hbm / 2))
    """

    units: int
    comm_units: int
    hbm_Bps: float
    comm_hbm_Bps: float
    compute: ComputeModel = field(compare=False, repr=False)
    _scales: dict[int, tuple[Op, float]] = field(default_factory=dict, init=False,
                                                 compare=False, repr=False)
    """`kernel_scale` per op, by identity (the op kept, so an id is never reused)."""

    def __post_init__(self) -> None:
        assert 0 < self.comm_units < self.units, (self.comm_units, self.units)
        assert 0.0 <= self.comm_hbm_Bps < self.hbm_Bps

    @property
    def hbm_left(self) -> float:
        """The fraction of HBM bandwidth a kernel beside communication keeps."""
        return 1.0 - self.comm_hbm_Bps / self.hbm_Bps

    @property
    def kernel_stretch(self) -> float:
        """A compute-bound kernel's: units / (units - comm_units)."""
        return self.units / (self.units - self.comm_units)

    @property
    def comm_stretch(self) -> float:
        return max(1.0, self.comm_hbm_Bps / (self.hbm_Bps / 2))

    @property
    def comm_wait_s(self) -> float:
        return 0.0

    @property
    def per_kernel(self) -> bool:
        return True

    def kernel_scale(self, op: Op) -> float:
        known = self._scales.get(id(op))
        if known is not None and known[0] is op:
            return known[1]
        alone = self.compute.duration(op)
        scale = 1.0
        if alone:
            beside = self.compute.shared_duration(op, self.units - self.comm_units,
                                                  self.hbm_left)
            scale = max(1.0, beside / alone)
        self._scales[id(op)] = (op, scale)
        return scale


def host_interference(profile: Profile) -> Interference:
    """The interference a profile states: `HostInterference`, or `NO_INTERFERENCE` where its
    three figures are 0 (every GPU preset)."""
    host = HostInterference.of(profile)
    if not (host.comm_interference or host.compute_interference
            or host.compute_interference_delay_s):
        return NO_INTERFERENCE
    return host


def interferes(model: Interference) -> tuple[bool, bool]:
    """Whether kernels can be slowed by communication, and communication by kernels: what the
    engine must keep track of."""
    return model.kernel_stretch != 1.0, model.comm_stretch != 1.0 or model.comm_wait_s != 0.0
