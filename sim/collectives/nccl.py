"""NCCL's own cost model: the latency and bandwidth it predicts for every algorithm and
protocol, the one it picks (the lowest predicted time), and the channels it then launches.

A faithful re-implementation of `ncclTopoTuneModel` and `ncclTopoGetAlgoTime`
(src/graph/tuning.cc) and of the channel/thread choice in `getAlgoInfo` (src/enqueue.cc),
NCCL 2.20.3. Constants live in `sim.collectives.protocols`; NCCL's view of the machine in
`sim.collectives.nccl_system`. Time for `S` bytes with algorithm a and protocol p:

    t = latency[a][p] + S / bandwidth[a][p]        (x 1.4 on latency: multi-node ring Simple)

where `bandwidth` is an algorithm bandwidth (bytes of the buffer per second; a ring's bus
bandwidth times n / nsteps). This is what NCCL *predicts*; `sim.collectives.nccl_plan` adds
what the prediction leaves out.

    >>> sys = NcclSystem(num_nodes=1, gpus_per_node=8, compute_capability=80, nvlinks=12)
    >>> choose(sys, OpKind.ALL_REDUCE, 16 << 20)
    (<Algo.RING: 'ring'>, <Proto.LL128: 'LL128'>)
"""

from __future__ import annotations

from sim.collectives.nccl_system import NcclSystem
from sim.collectives.protocols import (
    GBPS,
    LL_MAX_BW,
    LL_MAX_BW_BY_CPU,
    MAX_THREADS,
    NET_OVERHEAD_S,
    NVLS_MAX_ARITY,
    PCI_BW_BPS,
    PER_CH_MAX_RING_LL128,
    PER_CH_MAX_TREE,
    PER_CH_MAX_TREE_LL128,
    PROTOCOLS,
    TREE_CORRECTION,
    US,
    Algo,
    Hw,
    Proto,
)
from traces.ops import OpKind

AR, RS, AG, BCAST = (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER,
                     OpKind.BROADCAST)
NCCL_KINDS = (AR, RS, AG, BCAST)
SIMPLE_ONLY = (Algo.NVLS, Algo.NVLS_TREE, Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN)

# Which algorithms each collective has (tuning.cc: broadcast and reduce are ring-only;
# reduce-scatter and all-gather add NVLS and CollNet Direct).
ALGORITHMS: dict[OpKind, tuple[Algo, ...]] = {
    AR: tuple(Algo),
    RS: (Algo.RING, Algo.NVLS, Algo.COLLNET_DIRECT),
    AG: (Algo.RING, Algo.NVLS, Algo.COLLNET_DIRECT),
    BCAST: (Algo.RING,),
}


def nsteps(kind: OpKind, n: int) -> int:
    """Ring steps: all-reduce 2(n-1), reduce-scatter and all-gather n-1, broadcast n."""
    return 2 * (n - 1) if kind is AR else n - 1 if kind in (RS, AG) else n


def inter_steps(kind: OpKind, nodes: int) -> int:
    """Ring steps that cross the network (2.20: all-reduce counts 2 x nodes)."""
    if kind is AR:
        return 2 * nodes if nodes > 1 else 0
    return nodes - 1 if kind in (RS, AG) else nodes


def log2i(x: int) -> int:
    """NCCL's log2i: floor(log2(x)), 0 for x <= 1."""
    return max(x, 1).bit_length() - 1


def available(sys: NcclSystem, kind: OpKind, algo: Algo, proto: Proto) -> bool:
    """Is (algo, proto) enabled for this collective on this machine (NCCL defaults)?"""
    if kind not in ALGORITHMS or algo not in ALGORITHMS[kind] or sys.num_ranks < 2:
        return False
    if algo in SIMPLE_ONLY and proto is not Proto.SIMPLE:
        return False
    if algo is Algo.NVLS:
        # Intra-node NVLS; across nodes NVLS needs CollNet support (tuning.cc); reduce-scatter
        # and all-gather only up to NCCL_MAX_NVLS_ARITY local ranks (enqueue.cc).
        if kind is not AR and sys.gpus_per_node > NVLS_MAX_ARITY:
            return False
        return sys.nvls is not None and (sys.num_nodes == 1 or sys.collnet is not None)
    if algo is Algo.NVLS_TREE:
        return sys.nvls is not None and sys.num_nodes > 1
    if algo in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN):
        # CollNet Direct also wants an NVSwitch; CollNet on RS/AG needs a NIC per GPU.
        ok = sys.collnet is not None and (algo is Algo.COLLNET_CHAIN or sys.nvswitch)
        if kind in (RS, AG):
            ok = ok and sys.gpus_per_node <= sys.nics_per_node
        return ok
    if proto is Proto.LL128:
        # LL128 on by default only over NVLink on Volta/Ampere/Hopper (tuning.cc); the 2.2x
        # releases with Blackwell add `case 100` (and 120) to that switch. sm103 (B300, GB300)
        # is taken as sm100 here: a 2.2x copy read for this model has no `case 103` (LL128 off),
        # whether 2.27/2.28 add one was not checked.
        return sys.nvswitch
    return True


def _graph(sys: NcclSystem, algo: Algo):
    if algo is Algo.RING:
        return sys.ring
    if algo is Algo.TREE:
        return sys.tree
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        return sys.nvls
    return sys.collnet


def ll_max_bw(sys: NcclSystem) -> float:
    """llMaxBws: by GPU arch on one node, by CPU vendor across nodes (bytes/s)."""
    row = LL_MAX_BW[sys.arch_index] if sys.num_nodes == 1 else LL_MAX_BW_BY_CPU[sys.cpu_vendor]
    return row[sys.node_index] * GBPS


def bus_bandwidth(sys: NcclSystem, kind: OpKind, algo: Algo, proto: Proto) -> float:
    """NCCL's bus bandwidth (bytes/s) before conversion to an algorithm bandwidth."""
    g = _graph(sys, algo)
    nodes, ch, cc, i2 = sys.num_nodes, g.channels, sys.arch_index, sys.node_index
    ppn = sys.gpus_per_node
    collnet = algo in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN)
    bw = g.bw_intra_Bps if nodes <= 2 or collnet else g.bw_inter_Bps
    if algo is Algo.NVLS:
        bw = min(g.bw_intra_Bps, g.bw_inter_Bps)
    if algo is Algo.NVLS_TREE:
        bw = min(g.bw_intra_Bps, g.bw_inter_Bps / 2 if nodes > 2 else g.bw_inter_Bps)
    bus = ch * bw
    if algo is Algo.RING and proto is Proto.LL:
        bus = min(ll_max_bw(sys), bus * (1 / 4 if nodes > 1 or kind is AR else 1 / 3))
    if algo is Algo.RING and proto is Proto.LL128:
        bus = min(bus * (0.7 if ppn < 2 else 0.92), ch * PER_CH_MAX_RING_LL128[cc][i2] * GBPS)
    if algo is Algo.TREE:
        bus = min(bus * 0.92, ch * PER_CH_MAX_TREE[cc][i2] * GBPS)
        if proto is Proto.LL:
            bus = min(bus / 3.8, ll_max_bw(sys))
        if proto is Proto.LL128:
            bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128),
                      ch * PER_CH_MAX_TREE_LL128[cc][i2] * GBPS)
    if algo is Algo.COLLNET_DIRECT:
        if kind in (RS, AG):
            w = (ppn - 1) / (8 - 1)  # "measured corrective ratio" at 1 and 8 ppn, interpolated
            return ppn * bw * (w * 0.85 + (1 - w) * 0.95)
        factor = ppn / ch  # GPU/NIC ratio
        bus /= factor - (factor - 1) / 2
        if cc >= 90:
            bus *= 0.85
    return bus


def bandwidth(sys: NcclSystem, kind: OpKind, algo: Algo, proto: Proto) -> float:
    """NCCL's algorithm bandwidth (bytes/s), 0 where (algo, proto) is not available."""
    if not available(sys, kind, algo, proto):
        return 0.0
    bus = bus_bandwidth(sys, kind, algo, proto)
    if algo is Algo.COLLNET_DIRECT and kind in (RS, AG):
        return bus
    if algo is Algo.RING:
        return bus * sys.num_ranks / nsteps(kind, sys.num_ranks)
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        return bus * 5 / 6
    return bus * 0.5


def intra_hw(sys: NcclSystem) -> Hw:
    return Hw.NVLINK if sys.nvswitch else Hw.PCI


def latency(sys: NcclSystem, kind: OpKind, algo: Algo, proto: Proto) -> float:
    """NCCL's latency (seconds) of one collective with (algo, proto), before any size."""
    p = PROTOCOLS[proto]
    n, nodes, ppn = sys.num_ranks, sys.num_nodes, sys.gpus_per_node
    lat = p.base_latency(algo)
    intra = p.hop_latency(intra_hw(sys), algo)
    inter = p.hop_latency(Hw.NET, algo)  # graph latencyInter is 0 for IB NICs
    if algo is Algo.RING:
        hw = intra_hw(sys) if nodes == 1 else Hw.NET
        if kind is BCAST:
            return lat + p.hop_latency(hw, algo)  # NVSwitch rings are sameChannels
        overhead = NET_OVERHEAD_S[sys.cpu_vendor] * (3 if proto is Proto.SIMPLE else 1)
        if nodes > 1:
            intra = max(intra, overhead)
        steps, net = nsteps(kind, n), inter_steps(kind, nodes)
        return lat + (steps - net) * intra + net * inter
    if algo is Algo.TREE:
        return lat + 2 * ((ppn - 1) * intra + log2i(nodes) * inter)
    if algo is Algo.COLLNET_DIRECT:
        return lat + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4 * US) + inter
    if algo is Algo.COLLNET_CHAIN:
        return lat + 2 * (ppn - 1) * intra + inter
    if algo is Algo.NVLS:
        return intra + (inter if nodes > 1 else 0.0)
    return lat + intra + 2 * log2i(nodes) * inter  # NVLS_TREE


def tree_correction(proto: Proto, size_bytes: float) -> float:
    """treeCorrectionFactor for this size: trees run slower than modelled at mid sizes."""
    index = log2i(int(size_bytes) >> 6)
    table = TREE_CORRECTION[proto]
    return table[index] if index < len(table) else 1.0


def nccl_time(sys: NcclSystem, kind: OpKind, algo: Algo, proto: Proto,
              size_bytes: float) -> float | None:
    """`ncclTopoGetAlgoTime`: NCCL's predicted seconds, None where unavailable."""
    bw = bandwidth(sys, kind, algo, proto)
    if bw == 0:
        return None
    lat = latency(sys, kind, algo, proto)
    if algo is Algo.TREE:
        bw *= tree_correction(proto, size_bytes)
    if (algo is Algo.RING and proto is Proto.SIMPLE and sys.num_nodes > 1 and kind is AR
            and size_bytes / (sys.comm_channels * sys.num_ranks) >= 64):
        lat *= 1.4 if sys.arch_index >= 80 else 1.9  # "plateau effect of ring"
    return lat + size_bytes / bw


def options(sys: NcclSystem, kind: OpKind, size_bytes: float) -> dict[tuple[Algo, Proto], float]:
    """NCCL's predicted time of every available (algo, proto), in its search order."""
    times = {}
    for algo in Algo:
        for proto in Proto:
            t = nccl_time(sys, kind, algo, proto, size_bytes)
            if t is not None:
                times[algo, proto] = t
    return times


def choose(sys: NcclSystem, kind: OpKind, size_bytes: float,
           algos: tuple[Algo, ...] | None = None) -> tuple[Algo, Proto] | None:
    """What NCCL picks: the lowest predicted time (first on ties, as its `<` does).

    `algos` restricts the search like NCCL_ALGO. None when NCCL has no algorithm for this
    collective here (all-to-all is point-to-point in NCCL; a single rank copies).
    """
    times = {k: t for k, t in options(sys, kind, size_bytes).items()
             if algos is None or k[0] in algos}
    return min(times, key=times.__getitem__) if times else None


def max_threads(sys: NcclSystem, algo: Algo, proto: Proto) -> int:
    """comm->maxThreads: Simple rings no faster than PCIe get 256 threads (tuning.cc)."""
    if algo in SIMPLE_ONLY:
        return MAX_THREADS
    if algo is Algo.RING and proto is Proto.SIMPLE:
        slow = sys.ring.bw_intra_Bps * sys.ring.channels <= PCI_BW_BPS
        return 256 if slow else PROTOCOLS[proto].max_threads
    return PROTOCOLS[proto].max_threads


def channels(sys: NcclSystem, kind: OpKind, algo: Algo, proto: Proto,
             size_bytes: float) -> tuple[int, int]:
    """(channels, threads per channel) NCCL launches for this size (`getAlgoInfo`).

    Rings and trees drop a channel at a time while the buffer is smaller than
    channels x threads x threadThreshold bytes, then halve the threads; NVLS always uses
    its channels (16 on sm90; 24 or 32 on Blackwell).
    """
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        return sys.nvls_channels, MAX_THREADS
    nc, nt = sys.comm_channels, max_threads(sys, algo, proto)
    threshold = PROTOCOLS[proto].thread_threshold
    if algo is Algo.RING and proto is Proto.LL:
        threshold *= sys.num_ranks
    if algo in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN):
        threshold = 512
    while size_bytes < nc * nt * threshold:
        if nc >= 2:
            nc -= 1
        elif nt % 128 == 0:
            nt //= 2
        else:
            break
    return nc, nt


def describe(sys: NcclSystem, kind: OpKind) -> str:
    """NCCL's TUNING debug table for one collective: latency (us) / algbw (GB/s)."""
    cells = []
    for algo in Algo:
        for proto in Proto:
            bw = bandwidth(sys, kind, algo, proto)
            if bw:
                lat = latency(sys, kind, algo, proto)
                cells.append(f"{algo}/{proto} {lat / US:.1f}/{bw / GBPS:.1f}")
    return f"{kind}: " + " | ".join(cells)


__all__ = ["ALGORITHMS", "NCCL_KINDS", "available", "bandwidth", "bus_bandwidth", "channels",
           "choose", "describe", "latency", "nccl_time", "nsteps", "options"]
