"""How compute and communication on one rank slow each other: a cost model beside the compute
model (`sim.models.compute`), asked by the replay engine (`sim.engine.replay`) through
`Interference`.

    interference = host_interference(profile)     # the profile's figures; NO_INTERFERENCE if 0
    replay(plan, cluster, compute, interference=interference)

Three figures, each read by the engine once:
  - `kernel_stretch`: a kernel (or a run of kernels) that starts while its rank has a transfer
    in flight takes this many times as long (1: no effect);
  - `comm_wait_s`, `comm_stretch`: communication that starts while one of its ranks runs a
    kernel first waits `comm_wait_s`, then takes `comm_stretch` times as long (each latency
    and byte).
On a CPU host, gloo's threads share the cores the kernels run on (`HostInterference`, built
from the profile's comm_interference, compute_interference and compute_interference_delay_s,
fitted by `sim.calibrate.interference`); on a GPU, NCCL runs on SMs of its own: none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sim.profile import Profile


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


@dataclass(frozen=True, slots=True)
class NoInterference:
    """Compute and communication do not notice each other (a GPU: NCCL has SMs of its own)."""

    kernel_stretch: float = 1.0
    comm_stretch: float = 1.0
    comm_wait_s: float = 0.0


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
