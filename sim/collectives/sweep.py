"""An nccl-tests-like sweep of one collective over message sizes (`parasim collective`).

Each size is simulated on its own (nothing else on the network), with the flow model or the
analytic path. busbw uses nccl-tests' factors, so the numbers compare with theirs directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from sim.collectives import Algorithm, Collectives, Lowering, analytic_time, busbw_factor
from sim.collectives.direct import lower_sendrecv
from sim.engine.network import Network
from sim.engine.transport import NetworkMode
from topology.cluster import Cluster
from traces.errors import ConfigError
from traces.ops import COLLECTIVES, OpKind

OPS = (*[str(k) for k in COLLECTIVES], "sendrecv")
MAX_CHANNELS = 64  # NCCL's MAXCHANNELS in src/include/device.h of recent releases (older: 32)


@dataclass(frozen=True, slots=True)
class Row:
    size_bytes: int
    algo: str
    time_s: float
    algbw_GBps: float
    busbw_GBps: float


def flow_time(cluster: Cluster, lowering: Lowering, size_bytes: float) -> float:
    """Simulated time of one collective alone on the network (flow model)."""
    env = simpy.Environment()
    net = Network(env, cluster.link_capacity)
    done = net.run(net.register(lowering), size_bytes)
    env.run(until=done)  # superseded completion events may still sit in the queue after it
    return env.now


def sweep_row(cluster: Cluster, collectives: Collectives, op: str, group: tuple[int, ...],
              size: int, algo: Algorithm, channels: int | None, model: NetworkMode) -> Row:
    """One size of the sweep, alone on the network: by the flow model (`FLOW`) or its
    alpha-beta time (`ANALYTIC`)."""
    if op == "sendrecv":
        if algo not in (Algorithm.AUTO, Algorithm.DIRECT):
            raise ConfigError(f"--algo: sendrecv runs point-to-point only, not {algo}")
        used, lowering = str(Algorithm.DIRECT), lower_sendrecv(cluster, group)
        factor = 1.0
    else:
        kind = OpKind(op)
        used, lowering = collectives.resolve(kind, group, size, algo, channels)
        factor = busbw_factor(kind, len(group))
    assert model in (NetworkMode.FLOW, NetworkMode.ANALYTIC), f"no sweep by {model}"
    seconds = (flow_time if model == NetworkMode.FLOW else analytic_time)(cluster, lowering, size)
    algbw = size / seconds / 1e9
    return Row(size, used, seconds, algbw, algbw * factor)


def format_table(cluster: Cluster, op: str, algo: Algorithm, model: NetworkMode, rows: list[Row],
                 num_ranks: int) -> str:
    lines = [
        f"# parasim collective: {op} on {cluster.name}, {num_ranks} ranks, "
        f"algo {algo}, {model} model",
        f"# {'size(B)':>12} {'algo':>16} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}",
    ]
    for r in rows:
        lines.append(f"  {r.size_bytes:>12} {r.algo:>16} {r.time_s * 1e6:>12.2f} "
                     f"{r.algbw_GBps:>12.2f} {r.busbw_GBps:>12.2f}")
    return "\n".join(lines)
