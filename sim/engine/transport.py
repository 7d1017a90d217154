"""How the replay engine times communication: one strategy per network mode, chosen once.

    transport = transport_for(NetworkMode.FLOW, env, cluster, comm)
    event = transport.move(lowered, op, stretch, wait)   # None: free (nothing to wait for)

  - `FLOW`: the contended flow model (`sim.engine.network.Network`): every transfer in flight shares
    the links;
  - `ANALYTIC`: each transfer alone on the network, its alpha-beta time
    (`sim.collectives.analytic_time`);
  - `IDEAL`: communication is free (what-if analysis and schedule tests).
Under the first two, communication the trace does not size (its lowering's algorithm is
`MEASURED`, `sim.engine.lowering`) keeps its measured duration (`Measured`). `stretch` and `wait`
come from the interference model (`sim.models.interference`): every latency and byte `stretch` times
as long, after a wait of `wait` seconds; a measured duration is kept as it is.
"""

from __future__ import annotations

from collections.abc import Generator
from enum import StrEnum
from typing import Any, Protocol

import simpy

from sim.collectives import analytic_time
from sim.engine.lowering import MEASURED, CommPlan
from sim.engine.network import Network
from topology.cluster import Cluster
from traces.ops import Op


class NetworkMode(StrEnum):
    """How communication is timed (`[sim] network`, `--network`)."""

    FLOW = "flow"
    """The contended flow model."""
    ANALYTIC = "analytic"
    """Each transfer alone (alpha-beta)."""
    IDEAL = "ideal"
    """Free."""


NETWORK_NAMES = tuple(map(str, NetworkMode))
"""`NetworkMode`'s names as plain strings (argparse's choices, `traces.fields.check_choice`)."""


class Transport(Protocol):
    """Times the communication of the plan's lowerings (`CommPlan.lowered`)."""

    def move(self, lowered: int, op: Op, stretch: float, wait: float) -> simpy.Event | None:
        """An event that fires when `op` (of lowering `lowered`) has moved its bytes, or None
        when that takes no time."""
        ...


class Measured:
    """Communication the trace does not size: its measured duration."""

    def __init__(self, env: simpy.Environment) -> None:
        self.timeout = env.timeout

    def move(self, lowered: int, op: Op, stretch: float, wait: float) -> simpy.Event:
        assert op.start is not None and op.end is not None, "measured ops are timed"
        return self.timeout(op.end - op.start)


class Flow:
    """The flow model: one network shared by every transfer in flight."""

    def __init__(self, env: simpy.Environment, cluster: Cluster, comm: CommPlan) -> None:
        self.env = env
        self.net = Network(env, cluster.link_capacity)
        # A handle per lowering; -1 for measured communication, which keeps its duration.
        self.handles = [self.net.register(low.lowering) if low.algo != MEASURED else -1
                        for low in comm.lowered]
        self.measured = Measured(env)

    def move(self, lowered: int, op: Op, stretch: float, wait: float) -> simpy.Event:
        handle = self.handles[lowered]
        if handle < 0:
            return self.measured.move(lowered, op, stretch, wait)
        if wait:
            return self.env.process(self._after(wait, handle, op.size_bytes, stretch))
        return self.net.run(handle, op.size_bytes, stretch)

    def _after(self, wait: float, handle: int, size_bytes: float,
               stretch: float) -> Generator[simpy.Event, Any, None]:
        """Communication on the network that starts `wait` seconds from now."""
        yield self.env.timeout(wait)
        yield self.net.run(handle, size_bytes, stretch)


class Analytic:
    """Each transfer alone on the network: wait + alpha-beta time × stretch."""

    def __init__(self, env: simpy.Environment, cluster: Cluster, comm: CommPlan) -> None:
        self.timeout, self.cluster = env.timeout, cluster
        self.lowered = comm.lowered
        self.measured = Measured(env)

    def move(self, lowered: int, op: Op, stretch: float, wait: float) -> simpy.Event:
        low = self.lowered[lowered]
        if low.algo == MEASURED:
            return self.measured.move(lowered, op, stretch, wait)
        return self.timeout(wait + analytic_time(self.cluster, low.lowering, op.size_bytes)
                            * stretch)


class Ideal:
    """Free communication: nothing to wait for, measured or not."""

    def move(self, lowered: int, op: Op, stretch: float, wait: float) -> None:
        return None


def transport_for(mode: NetworkMode, env: simpy.Environment, cluster: Cluster,
                  comm: CommPlan) -> Transport:
    """The strategy of `mode`."""
    match mode:
        case NetworkMode.FLOW:
            return Flow(env, cluster, comm)
        case NetworkMode.ANALYTIC:
            return Analytic(env, cluster, comm)
        case NetworkMode.IDEAL:
            return Ideal()
    raise AssertionError(f"no transport for {mode!r}")
