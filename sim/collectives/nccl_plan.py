"""What a collective really costs under NCCL: its choice, plus what NCCL's model leaves out.

`sim.collectives.nccl` predicts t = latency + S / bandwidth with bandwidths NCCL calibrated at
large sizes; measured nccl-tests runs are slower at mid sizes. Modelled here from NCCL's own
mechanics and constants: the kernel launch, the handshake per piece a channel moves beyond
full pieces, and each protocol's payload per wire byte. With the (algo, proto, channels) NCCL
picks:

    t = launch + latency_nccl + extra x hwLat + S / bandwidth_physical

`NcclPlan` carries these terms for the flow model. The derivation, and what published A100
runs say about each term, are in docs/nccl-cost.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import ceil

from sim.collectives.nccl import (
    AG,
    AR,
    BCAST,
    NCCL_KINDS,
    RS,
    bandwidth,
    bus_bandwidth,
    channels,
    choose,
    intra_hw,
    latency,
    ll_max_bw,
    log2i,
    nccl_time,
    nsteps,
)
from sim.collectives.nccl_system import NcclSystem
from sim.collectives.protocols import (
    CHUNK_STEPS_RING,
    GBPS,
    NET_OVERHEAD_S,
    NVLS_CHUNK_BYTES,
    PER_CH_MAX_TREE,
    PROTOCOLS,
    SLICE_STEPS_RING,
    US,
    Algo,
    Proto,
)
from sim.engine.flows import Lowering, solo_time
from traces.errors import ConfigError
from traces.ops import OpKind

# Launch cost of one collective beyond NCCL's latency and the handshakes of item 2.
# At tiny sizes a ring all-reduce on 8 GPUs costs NCCL's 15.0 us (ring LL: 6.6 + 14 x 0.6)
# plus 14 one-piece steps x 0.6 us = 23.4 us here. One process per GPU measures 17.9-25.3 us
# from 8 B to 4 KiB (8 A100-80GB, mpirun, NCCL from pip: tests/bench/data, a100-thanos-mpi)
# and 16.96 us at 1 KiB (Azure NDmv4, NCCL 2.17.1, CUDA-graph launches; microsoft/mscclpp
# docs/performance-ndmv4.md): nothing left for the host, whose launch of the next call
# overlaps the running one when calls come back to back, as in a training step's stream.
LAUNCH_S = 0.0 * US
# One thread launching all 8 GPUs (nccl-tests -g 8) launches 8 kernels in a row per call:
# 38.4-42.1 us (8 A100-80GB) and 34.8-37.2 us (8 A100-80GB, NCCL 2.19.3) from 8 B to 4 KiB,
# 13-16 us over 23.4: 15 us, about 1.9 us per kernel launch.
LAUNCH_SINGLE_THREAD_S = 15.0 * US


@dataclass(frozen=True, slots=True)
class Pieces:
    """How a channel moves its share: `count` pieces, where `full` would do at full size."""

    count: int
    full: float
    piece_bytes: float

    @property
    def extra(self) -> float:
        return max(0.0, self.count - self.full)


def _chunking(sys: NcclSystem, kind: OpKind, algo: Algo, proto: Proto, size_bytes: float,
              nc: int) -> tuple[float, float, int, int, int]:
    """(chunk, full chunk, chunks per loop, steps per loop, slices per chunk), in payload
    bytes, as `computeColl` (src/enqueue.cc) sets them for this size."""
    step = PROTOCOLS[proto].step_bytes
    n, ppn = sys.num_ranks, sys.gpus_per_node
    if algo is Algo.RING:
        bulk = proto is Proto.SIMPLE and kind in (AR, RS, AG)
        chunk = float(step * (CHUNK_STEPS_RING if bulk else 1))
        slices = CHUNK_STEPS_RING // SLICE_STEPS_RING if bulk else 1
        if kind is BCAST:
            return chunk, chunk, 1, 1, slices
        return chunk, chunk, n, nsteps(kind, n), slices
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        full = chunk = float(NVLS_CHUNK_BYTES)
        ops = nc * ppn  # concurrentOps = channels x NVLS heads
        rules = ((64, 65536), (8, 32768), (2, 16384)) if algo is Algo.NVLS else \
            ((32, 262144), (16, 131072), (4, 65536), (1, 32768))
        for times, smaller in rules:
            if size_bytes < times * ops * chunk and chunk > smaller:
                chunk = smaller
        return chunk, full, ppn, 1, 1
    full = chunk = float(step)
    if algo is Algo.TREE and proto is Proto.SIMPLE:
        depth = ppn - 1 + log2i(sys.num_nodes)
        for times, floor in ((8, 131072.0), (4, 65536.0), (1, 32768.0)):
            while size_bytes / (nc * chunk) < depth * times and chunk > floor:
                chunk /= 2
    if algo is Algo.TREE and proto is Proto.LL128:
        steps_ll128 = 1 + log2i(sys.num_nodes) + 0.1 * ppn
        for times, floor in ((64, 131072 * 15 / 16), (16, 32768 * 15 / 16.0)):
            while size_bytes / (nc * chunk) < steps_ll128 * times / ppn and chunk > floor:
                chunk /= 2
    return chunk, full, 1, 1, 1


def pieces(sys: NcclSystem, kind: OpKind, algo: Algo, proto: Proto, size_bytes: float,
           nc: int) -> Pieces:
    """Pieces each channel moves: loops x steps per loop x slices per chunk."""
    chunk, full, per_loop, steps, slices = _chunking(sys, kind, algo, proto, size_bytes, nc)
    loop = nc * per_loop * chunk
    loops = max(1, ceil(size_bytes / loop))
    piece = min(chunk, size_bytes / (nc * per_loop)) / slices
    return Pieces(loops * steps * slices, size_bytes / (nc * per_loop * full) * steps * slices,
                  piece)


def piece_overhead(sys: NcclSystem, algo: Algo, proto: Proto) -> float:
    """Handshake cost of one piece: the protocol's step latency inside the node (NCCL's
    intra-node `hwLat`), and across nodes at least the proxy's network post overhead per step
    (`getNetOverhead`, x3 for Simple), as NCCL itself bounds every step of a multi-node ring.
    NVLS and CollNet kernels run Simple FIFO steps over NVLink: a Simple ring step, 3.4 us."""
    if algo not in (Algo.RING, Algo.TREE):
        return PROTOCOLS[Proto.SIMPLE].hop_latency(intra_hw(sys), Algo.RING)
    step = PROTOCOLS[proto].hop_latency(intra_hw(sys), algo)
    if sys.num_nodes > 1:
        step = max(step, NET_OVERHEAD_S[sys.cpu_vendor] * (3 if proto is Proto.SIMPLE else 1))
    return step


def physical_bandwidth(sys: NcclSystem, kind: OpKind, algo: Algo, proto: Proto,
                       nc: int) -> float:
    """Algorithm bandwidth (bytes/s) with the protocol's real payload share and the channels
    actually launched (NCCL scales a ring or tree linearly with channels, getAlgoTime)."""
    if algo not in (Algo.RING, Algo.TREE):
        return bandwidth(sys, kind, algo, proto)
    g = sys.ring if algo is Algo.RING else sys.tree
    wire = PROTOCOLS[proto].wire_factor
    if proto is Proto.LL:
        bw = g.bw_intra_Bps if sys.num_nodes <= 2 else g.bw_inter_Bps
        bus = g.channels * bw
        if algo is Algo.TREE:
            cap = g.channels * PER_CH_MAX_TREE[sys.arch_index][sys.node_index] * GBPS
            bus = min(bus * 0.92, cap)
        bus = min(bus / wire, ll_max_bw(sys))
    else:
        bus = bus_bandwidth(sys, kind, algo, proto)
    bus *= min(1.0, nc / sys.comm_channels)
    if algo is Algo.RING:
        return bus * sys.num_ranks / nsteps(kind, sys.num_ranks)
    return bus * 0.5


def gpu_bytes_per_payload(kind: OpKind, algo: Algo, n: int) -> float:
    """Payload bytes each GPU sends on its busiest link direction per buffer byte.

    Ring all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, broadcast 1; a tree
    all-reduce sends the buffer up and down through the same link: 2. NVLS all-reduce pushes
    the buffer up for the reduction and its own share once more for the multicast, and pulls
    every share down: 1 + 1/n each way (nccl#2140); its reduce-scatter pushes the buffer up,
    its all-gather pulls it down: at most 1. CollNet: 1.
    """
    if algo is Algo.RING:
        return nsteps(kind, n) / n if kind is not BCAST else 1.0
    if algo is Algo.TREE:
        return 2.0
    if algo in (Algo.NVLS, Algo.NVLS_TREE) and kind is AR:
        return 1 + 1 / n
    return 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclPlan:
    """How NCCL runs one collective of `size_bytes`, and its uncontended cost."""

    kind: OpKind
    num_ranks: int
    size_bytes: float
    algorithm: Algo
    protocol: Proto
    channels: int
    threads: int
    latency_s: float
    """Launch + NCCL's latency + the handshakes of the extra pieces."""
    bandwidth_Bps: float
    """Algorithm bandwidth when nothing else is on the links (buffer bytes per second)."""
    wire_factor: float
    """Bytes on the wire per payload byte: LL 2, LL128 128/120, Simple 1."""
    nccl_time_s: float
    """NCCL's own prediction for the same choice."""

    @property
    def time_s(self) -> float:
        """Closed-form time with nothing else on the network."""
        return self.latency_s + self.size_bytes / self.bandwidth_Bps

    def wire_bytes_factor(self, link_algbw_Bps: float) -> float:
        """Bytes the flow model must move per payload byte so that, alone on links whose
        algorithm bandwidth is `link_algbw_Bps`, it takes this plan's time: the protocol's
        wire factor, or more where NCCL's ceilings (LL cap, LL128 per channel, NVLS) bind
        below the links' rate. Never below 1: no prediction beats the wires."""
        return max(self.wire_factor, link_algbw_Bps / self.bandwidth_Bps, 1.0)


def plan(sys: NcclSystem, kind: OpKind, size_bytes: float, *, algo: Algo | None = None,
         proto: Proto | None = None, launch_s: float = LAUNCH_S) -> NcclPlan:
    """NCCL's choice for this collective (or the forced one) and what it really costs."""
    if kind not in NCCL_KINDS:
        raise ConfigError(f"nccl: NCCL has no tuned algorithm for {kind} "
                          "(it runs point-to-point)")
    if size_bytes <= 0:
        raise ConfigError(f"nccl: size {size_bytes} must be positive")
    picked = choose(sys, kind, size_bytes, (algo,) if algo else None) if not proto else \
        _forced(sys, kind, size_bytes, algo, proto)
    if picked is None:
        raise ConfigError(f"nccl: no NCCL algorithm {algo or ''} for {kind} on "
                          f"{sys.num_ranks} ranks over {sys.num_nodes} nodes")
    a, p = picked
    nc, nt = channels(sys, kind, a, p, size_bytes)
    extra = pieces(sys, kind, a, p, size_bytes, nc).extra
    lat = launch_s + latency(sys, kind, a, p) + extra * piece_overhead(sys, a, p)
    predicted = nccl_time(sys, kind, a, p, size_bytes)
    assert predicted is not None
    return NcclPlan(kind=kind, num_ranks=sys.num_ranks, size_bytes=size_bytes, algorithm=a,
                    protocol=p, channels=nc, threads=nt, latency_s=lat,
                    bandwidth_Bps=physical_bandwidth(sys, kind, a, p, nc),
                    wire_factor=PROTOCOLS[p].wire_factor, nccl_time_s=predicted)


def _forced(sys: NcclSystem, kind: OpKind, size_bytes: float, algo: Algo | None,
            proto: Proto) -> tuple[Algo, Proto] | None:
    """The fastest algorithm by NCCL's model for a forced protocol (like NCCL_PROTO)."""
    times = {}
    for a in (algo,) if algo else tuple(Algo):
        t = nccl_time(sys, kind, a, proto, size_bytes)
        if t is not None:
            times[a, proto] = t
    return min(times, key=times.__getitem__) if times else None


def with_protocol(base: Lowering, p: NcclPlan, capacity: Sequence[float]) -> Lowering:
    """`base` (the flows of p's algorithm) carrying p's latency and wire bytes, for the flow
    model: the first round waits `p.latency_s` instead of the links' latency, and every flow
    carries `wire_bytes_factor` times its bytes, so that alone on the network the lowering
    takes `p.time_s` and, shared, it feels contention on the links it really uses."""
    bare = tuple(tuple((replace(f, latency_s=0.0), factor) for f, factor in rnd) for rnd in base)
    link_algbw = p.size_bytes / solo_time(bare, p.size_bytes, capacity)
    scale = p.wire_bytes_factor(link_algbw)
    return tuple(tuple((replace(f, latency_s=p.latency_s if k == 0 else 0.0), factor * scale)
                       for f, factor in rnd) for k, rnd in enumerate(base))
