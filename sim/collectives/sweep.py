"""An nccl-tests-like sweep of one collective over message sizes (`parasim collective`).

Each size is simulated on its own (nothing else on the network), with the flow model or the
analytic path. busbw uses nccl-tests' factors, so the numbers compare with theirs directly. The
table reads like nccl-tests' (`all_reduce_perf`): size, count, type, redop, root, out-of-place
and in-place time, algbw and busbw, `#wrong`, and the "Avg bus bandwidth" line. parasim moves
no data and models no copy between the two buffers, so its in-place times are its out-of-place
ones and `#wrong` is N/A (as nccl-tests prints it with its check off, `-c 0`).

`reduce` is NCCL's ring Reduce: the chain of ring Broadcast run the other way (tuning.cc
counts both nRanks steps at one bandwidth; every link carries the buffer once), so it takes
broadcast's lowering and NCCL choice; nccl-tests' busbw factor for it is 1.
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

OPS = (*[str(k) for k in COLLECTIVES], "sendrecv", "reduce")
MAX_CHANNELS = 64  # NCCL's MAXCHANNELS in src/include/device.h of recent releases (older: 32)
DTYPES = {"int8": 1, "uint8": 1, "half": 2, "bfloat16": 2, "float": 4, "int32": 4,
          "uint32": 4, "double": 8, "int64": 8, "uint64": 8}
"""nccl-tests' `-d` type names and their bytes (src/common.cu `test_typenames`); the count
column is the size in these elements. parasim's time does not depend on the type."""
REDOPS = ("sum", "prod", "max", "min", "avg")
"""nccl-tests' `-o` reduction operations (its redop column; none for a gather or copy)."""
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
ROOTED = ("broadcast", "reduce")
"""Collectives with a root (nccl-tests' root column: -1 for the others)."""


@dataclass(frozen=True, slots=True)
class Row:
    size_bytes: int
    algo: str
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    count: int = 0
    """Elements of `type` in the buffer (nccl-tests' count)."""
    type: str = "float"
    redop: str = "sum"
    """The reduction, "none" for a collective that reduces nothing."""
    root: int = -1
    in_place_time_s: float = 0.0
    """The in-place time: the out-of-place one (parasim models no copy between buffers)."""
    in_place_algbw_GBps: float = 0.0
    in_place_busbw_GBps: float = 0.0


def flow_time(cluster: Cluster, lowering: Lowering, size_bytes: float) -> float:
    """Simulated time of one collective alone on the network (flow model)."""
    env = simpy.Environment()
    net = Network(env, cluster.link_capacity)
    done = net.run(net.register(lowering), size_bytes)
    env.run(until=done)  # superseded completion events may still sit in the queue after it
    return env.now


def sweep_row(cluster: Cluster, collectives: Collectives, op: str, group: tuple[int, ...],
              size: int, algo: Algorithm, channels: int | None, model: NetworkMode,
              dtype: str = "float", redop: str = "sum", root: int = 0) -> Row:
    """One size of the sweep, alone on the network: by the flow model (`FLOW`) or its
    alpha-beta time (`ANALYTIC`)."""
    if op == "reduce":  # the broadcast chain reversed (see the module docstring)
        used, lowering = collectives.resolve(OpKind.BROADCAST, group, size, algo, channels)
        factor = 1.0
    elif op == "sendrecv":
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
    return Row(size, used, seconds, algbw, algbw * factor, count=size // DTYPES[dtype],
               type=dtype, redop=redop if op in REDUCING else "none",
               root=root if op in ROOTED else -1, in_place_time_s=seconds,
               in_place_algbw_GBps=algbw, in_place_busbw_GBps=algbw * factor)


def avg_busbw(rows: list[Row]) -> float:
    """nccl-tests' "Avg bus bandwidth": the mean busbw over every size, out-of-place and
    in-place runs alike (src/common.cu averages `bw` over `bw_count` of both)."""
    values = [b for r in rows for b in (r.busbw_GBps, r.in_place_busbw_GBps)]
    return sum(values) / len(values) if values else 0.0


def format_table(cluster: Cluster, op: str, algo: Algorithm, model: NetworkMode, rows: list[Row],
                 num_ranks: int) -> str:
    """nccl-tests' table (src/common.cu's header and row formats), with parasim's algorithm
    as a last column."""
    lines = [
        f"# parasim collective: {op} on {cluster.name}, {num_ranks} ranks, "
        f"algo {algo}, {model} model",
        "# in-place times are the out-of-place ones (parasim models no copy between the "
        "buffers); #wrong: N/A (no data moves)",
        f"#{'':>54}out-of-place{'':>23}in-place",
        f"# {'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'root':>6} {'time':>8} "
        f"{'algbw':>7} {'busbw':>7} {'#wrong':>6} {'time':>8} {'algbw':>7} {'busbw':>7} "
        f"{'#wrong':>6}  algo",
        f"# {'(B)':>10} {'(elements)':>12} {'':>8} {'':>6} {'':>6} {'(us)':>8} {'(GB/s)':>7} "
        f"{'(GB/s)':>7} {'':>6} {'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7}",
    ]
    for r in rows:
        lines.append(f"  {r.size_bytes:>10} {r.count:>12} {r.type:>8} {r.redop:>6} {r.root:>6} "
                     f"{_us(r.time_s)} {r.algbw_GBps:>7.2f} {r.busbw_GBps:>7.2f} {'N/A':>6} "
                     f"{_us(r.in_place_time_s)} {r.in_place_algbw_GBps:>7.2f} "
                     f"{r.in_place_busbw_GBps:>7.2f} {'N/A':>6}  {r.algo}")
    lines += ["# Out of bounds values : N/A (parasim moves no data)",
              f"# Avg bus bandwidth    : {avg_busbw(rows):.4g} ", "#"]
    return "\n".join(lines)


def _us(seconds: float) -> str:
    """A time as nccl-tests writes it: %7.2f us, %7.1f from 10 ms, %7.0f from 1 s."""
    us = seconds * 1e6
    return f"{us:>8.2f}" if us < 1e4 else f"{us:>8.1f}" if us < 1e6 else f"{us:>8.0f}"


def geometric_sizes(lo: int, hi: int, factor: int, flag: str = "-b/-e/-f") -> list[int]:
    """nccl-tests' -b lo -e hi -f factor: lo, lo*f, ... up to hi."""
    if isinstance(factor, bool) or not isinstance(factor, int) or not 2 <= factor <= 1024:
        raise ConfigError(f"-f: {factor!r} must be an integer from 2 to 1024 (nccl-tests' "
                          "step factor)")
    if lo > hi:
        raise ConfigError(f"{flag}: -b {lo} is above -e {hi}")
    sizes = []
    while lo <= hi:
        sizes.append(lo)
        lo *= factor
    return sizes
