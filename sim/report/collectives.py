"""The per-collective table: what each kind of communication carries, how often, how big, by
which algorithm and protocol, and the bus bandwidth it achieved against what the links allow.

Rows group the communication ops of the simulated ranks by (what it carries, kind, group size,
bytes, algorithm). The algorithm is the one the replay ran (`sim.engine.lowering`, NCCL-style names
such as `ring/LL128`). Bus bandwidth follows nccl-tests: busbw = factor * bytes / time, factor
2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter, all-gather and all-to-all, 1 for a send.
The links' peak is the same algorithm's flows on an idle network with no latency and no
protocol overhead: factor * bytes / (bytes at each round's bottleneck rate), so achieved / peak
is what latency, protocol and contention leave of the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sim.collectives import Collectives, busbw_factor
from sim.config import Experiment
from sim.engine.flows import Lowering, solo_time
from sim.engine.lowering import CommPlan, TransferKey, lower_communication
from sim.engine.replay import StepTimes
from sim.report.timeline import RankOps
from topology.cluster import Cluster
from traces.ops import Op, OpKind


@dataclass(frozen=True, slots=True, kw_only=True)
class CommInfo:
    """What the replay did with one communication op."""

    carries: str
    """The op's name (`tp`, `grads`, ...); `p2p act` / `p2p grad` for sends and receives."""
    kind: str
    group_size: int
    size_bytes: float
    algo: str
    factor: float
    """nccl-tests' bus-bandwidth factor."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveRow:
    carries: str
    kind: str
    group_size: int
    size_bytes: float
    algo: str
    calls: int
    """Over all the simulated ranks."""
    time_s: float
    """Sum of the calls' durations over the simulated ranks."""
    busbw_Bps: float
    """Achieved: sum of factor * bytes over sum of durations."""
    peak_busbw_Bps: float


class CommIndex:
    """The replay's communication plan, read back per op (lowering is pure, so this is the
    algorithm the replay ran)."""

    def __init__(self, exp: Experiment, times: StepTimes) -> None:
        plan = times.plan
        self.plan: CommPlan = lower_communication(plan, exp.cluster, plan.meta.fold,
                                                  algo=exp.algo)
        self.cluster = exp.cluster
        self._collectives = Collectives(exp.cluster)
        self._peaks: dict[tuple[object, ...], float] = {}

    def info(self, rank: int, index: int, op: Op) -> CommInfo:
        lowered = self.plan.lowered[self.plan.ops[rank][index].lowered]
        if op.kind.is_p2p:
            return CommInfo(carries=f"p2p {op.tag}".strip(), kind="send/recv", group_size=2,
                            size_bytes=op.size_bytes, algo=lowered.algo, factor=1.0)
        n = len(op.group)
        return CommInfo(carries=op.name or "-", kind=str(op.kind), group_size=n,
                        size_bytes=op.size_bytes, algo=lowered.algo,
                        factor=busbw_factor(op.kind, n))

    def peak_busbw(self, rank: int, index: int, op: Op) -> float:
        """Bus bandwidth of the op's algorithm on idle links, without latency or protocol."""
        lowered = self.plan.lowered[self.plan.ops[rank][index].lowered]
        key = lowered.key
        cache_key: tuple[object, ...] = (key, lowered.algo)
        if cache_key not in self._peaks:
            if isinstance(key, TransferKey):
                structure = self._collectives.p2p(key.src, key.dst)
                factor = 1.0
            else:
                found = self._collectives.lowering(key.kind, key.group, lowered.algo,
                                                   split=key.split)
                structure = found if found is not None else lowered.lowering
                factor = busbw_factor(key.kind, len(key.group))
            self._peaks[cache_key] = _wire_busbw(structure, factor, self.cluster)
        return self._peaks[cache_key]


def _wire_busbw(lowering: Lowering, factor: float, cluster: Cluster) -> float:
    size = 2.0**30  # any size: with no latency the time is proportional to it
    bare = tuple(tuple((replace(f, latency_s=0.0), share) for f, share in rnd)
                 for rnd in lowering)
    seconds = solo_time(bare, size, cluster.link_capacity)
    return factor * size / seconds if seconds > 0 else float("inf")


def collective_rows(times: StepTimes, comm: CommIndex, cols: dict[int, RankOps]
                    ) -> list[CollectiveRow]:
    """One row per kind of communication, the most time first. p2p rows count sends only
    (a receive is the same transfer seen from the other end)."""
    acc: dict[CommInfo, list[float]] = {}  # -> calls, time, factor*bytes, peak
    infos: dict[tuple[object, ...], CommInfo] = {}
    for rank in times.plan.ranks:
        ops, c, table = times.plan.ops[rank], cols[rank], comm.plan.ops[rank]
        dur = c.ends - c.starts
        for i in np.flatnonzero(~c.is_compute).tolist():
            op = ops[i]
            if op.kind is OpKind.RECV:
                continue
            raw = (op.name, op.tag, op.kind, table[i].lowered)
            info = infos.get(raw)
            if info is None:
                info = infos[raw] = comm.info(rank, i, op)
            row = acc.get(info)
            if row is None:
                row = acc[info] = [0, 0.0, 0.0, comm.peak_busbw(rank, i, op)]
            row[0] += 1
            row[1] += dur[i]
            row[2] += info.factor * info.size_bytes
    rows = [CollectiveRow(carries=k.carries, kind=k.kind, group_size=k.group_size,
                          size_bytes=k.size_bytes, algo=k.algo, calls=int(v[0]), time_s=v[1],
                          busbw_Bps=v[2] / v[1] if v[1] > 0 else float("inf"),
                          peak_busbw_Bps=v[3])
            for k, v in acc.items()]
    rows.sort(key=lambda r: (-r.time_s, r.carries, r.kind, r.size_bytes))
    return rows
