"""NCCL's protocols and the constants of its tuning model, in SI units.

Every figure is taken from NCCL 2.20.3 (NVIDIA/nccl at b6475625, makefiles/version.mk says
2.20.3) unless a comment says otherwise; the file is named next to each one. NCCL states
latencies in microseconds and bandwidths in GB/s (1e9 bytes/s); here they are seconds and
bytes/s. The values are NCCL's (figures may be used); the code is ours.

Three protocols move data between GPUs:

* **LL** (low latency): each 8-byte store carries 4 bytes of data and a 4-byte flag, so the
  receiver polls the data itself; 2 bytes on the wire per payload byte.
* **LL128**: a 128-byte line carries 120 bytes of data and an 8-byte flag; 128/120 on the wire.
* **Simple**: bulk copies into a FIFO of buffers, with a flag (head/tail counter) per step;
  1 byte on the wire per payload byte, but each step costs a handshake.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Proto(StrEnum):
    LL = "LL"
    LL128 = "LL128"
    SIMPLE = "Simple"


class Algo(StrEnum):
    """NCCL's algorithms, in the order of its NCCL_ALGO_* indices (src/include/devcomm.h)."""

    TREE = "tree"
    RING = "ring"
    COLLNET_DIRECT = "collnet_direct"
    COLLNET_CHAIN = "collnet_chain"
    NVLS = "nvls"
    NVLS_TREE = "nvls_tree"


class Hw(StrEnum):
    """The link kind a step crosses, as NCCL's hwLat table indexes it."""

    NVLINK = "nvlink"
    PCI = "pci"
    NET = "net"


US = 1e-6
GBPS = 1e9
NCCL_VERSION = "2.20.3"

NCCL_STEPS = 8  # FIFO slots per connection (src/include/device.h)


@dataclass(frozen=True, slots=True, kw_only=True)
class Protocol:
    """One protocol: its latencies per algorithm and link kind, and what a step carries."""

    proto: Proto
    base_latency_s: Mapping[Algo, float]
    """`baseLat`: fixed cost of a collective with this algorithm and protocol."""
    hop_latency_s: Mapping[tuple[Hw, Algo], float]
    """`hwLat`: cost of one pipeline step over a link of this kind."""
    wire_factor: float
    """Bytes on the wire per payload byte."""
    step_bytes: int
    """Payload bytes one FIFO step carries: buffSizes[p] / NCCL_STEPS, less the flags."""
    max_threads: int
    """Threads per channel (NCCL_*_MAX_NTHREADS, src/include/device.h)."""
    thread_threshold: int
    """Bytes per thread below which NCCL drops channels (NCCL_*_THREAD_THRESHOLD, comm.h)."""

    def base_latency(self, algo: Algo) -> float:
        return self.base_latency_s.get(algo, 0.0)

    def hop_latency(self, hw: Hw, algo: Algo) -> float:
        return self.hop_latency_s.get((hw, algo), 0.0)


def _hops(nvlink: dict[Algo, float], pci: dict[Algo, float],
          net: dict[Algo, float]) -> dict[tuple[Hw, Algo], float]:
    table = {}
    for hw, row in ((Hw.NVLINK, nvlink), (Hw.PCI, pci), (Hw.NET, net)):
        for algo, us in row.items():
            table[hw, algo] = us * US
    return table


T, R, CD, CC, NV, NT = (Algo.TREE, Algo.RING, Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN,
                        Algo.NVLS, Algo.NVLS_TREE)

# baseLat and hwLat, src/graph/tuning.cc (2.20.3); rows Tree, Ring, CollNetDirect, CollNetChain,
# NVLS, NVLSTree; columns LL, LL128, Simple. CollNet and NVLS run Simple only.
LL = Protocol(
    proto=Proto.LL,
    base_latency_s={T: 6.8 * US, R: 6.6 * US},
    hop_latency_s=_hops({T: 0.6, R: 0.6}, {T: 1.0, R: 1.0}, {T: 5.0, R: 2.7}),
    wire_factor=8 / 4,  # union ncclLLFifoLine: data1, flag1, data2, flag2 (4-byte words)
    # DEFAULT_LL_BUFFSIZE (src/init.cc) = 8 lines/thread * 512 threads * 8 steps * 16 B
    # = 524,288 B; one step = 65,536 B of lines = 32,768 B of data.
    step_bytes=8 * 512 * 16 // 2,
    max_threads=512,  # NCCL_LL_MAX_NTHREADS
    thread_threshold=8,  # NCCL_LL_THREAD_THRESHOLD (times nRanks for rings, tuning.cc)
)
LL128 = Protocol(
    proto=Proto.LL128,
    base_latency_s={T: 14.0 * US, R: 14.0 * US},
    hop_latency_s=_hops({T: 1.25, R: 1.9}, {T: 1.9, R: 2.5}, {T: 8.5, R: 4.0}),
    wire_factor=128 / 120,  # NCCL_LL128_LINESIZE 128 B, NCCL_LL128_DATAELEMS 15 of 16 u64
    # DEFAULT_LL128_BUFFSIZE = 120 u64/thread * 640 threads * 8 steps * 8 B = 4,915,200 B;
    # one step = 614,400 B of lines = 576,000 B of data.
    step_bytes=120 * 640 * 8 * 15 // 16,
    max_threads=640,  # NCCL_LL128_MAX_NTHREADS
    thread_threshold=8,  # NCCL_LL128_THREAD_THRESHOLD
)
SIMPLE = Protocol(
    proto=Proto.SIMPLE,
    base_latency_s={R: 8.4 * US},
    hop_latency_s=_hops(
        {T: 28.0, R: 3.4, CD: 3.7, CC: 2.8, NV: 23.0, NT: 23.0},
        {T: 28.0, R: 5.7, CD: 3.7, CC: 2.8},
        {T: 28.0, R: 14.0, CD: 31.0, CC: 30.0, NV: 18.0, NT: 14.0}),
    wire_factor=1.0,
    step_bytes=(1 << 22) // NCCL_STEPS,  # DEFAULT_BUFFSIZE 4 MiB / 8 steps = 512 KiB
    max_threads=512,  # NCCL_SIMPLE_MAX_NTHREADS (256 when the ring is no faster than PCIe)
    thread_threshold=64,  # NCCL_SIMPLE_THREAD_THRESHOLD
)
PROTOCOLS: dict[Proto, Protocol] = {p.proto: p for p in (LL, LL128, SIMPLE)}

MAX_THREADS = 640  # NCCL_MAX_NTHREADS: NVLS and CollNet kernels
PCI_BW_BPS = 12.0 * GBPS  # PCI_BW (src/graph/topo.h)
# Per-link NVLink data rate NCCL assumes (src/graph/topo.h): SM80_NVLINK_BW 20.0 GB/s and
# SM90_NVLINK_BW 20.6 GB/s for a 25 GB/s link (NVLink3/4 line rate per direction).
NVLINK_LINK_BPS = {80: 20.0 * GBPS, 90: 20.6 * GBPS, 100: 40.1 * GBPS}
NVLINK_LINE_BPS = 25.0 * GBPS
# Blackwell (sm100 B200/GB200, sm103 B300/GB300): SM100_NVLINK_BW 40.1 GB/s a link
# (NVIDIA/nccl src/graph/topo.h@v2.27, `ncclTopoNVLinkBw`: cudaCompCap >= 100) for an NVLink 5
# link of 50 GB/s a direction (Blackwell: 18 links, 1.8 TB/s both ways per GPU).
NVLINK_LINE_BPS_BY_ARCH = {80: NVLINK_LINE_BPS, 90: NVLINK_LINE_BPS, 100: 50.0 * GBPS}

# Speeds the graph search tries, GB/s (src/graph/search.cc, 2.20.3): intra-node and with NICs,
# before and from sm90.
SPEEDS_INTRA = {80: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
                90: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0),
                # sm100SpeedArrayIntra, src/graph/search.cc@v2.27
                100: (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)}
SPEEDS_INTER = {80: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0,
                     4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
                90: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                     3.0, 2.4, 1.2, 0.24, 0.12),
                # sm100SpeedArrayInter, src/graph/search.cc@v2.27
                100: (96.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                      3.0, 2.4, 1.2, 0.24, 0.12)}
MAX_SEARCH_CHANNELS = 16  # MAXCHANNELS/2 (MAXCHANNELS 32 in 2.20): graph search limit
# NCCL_MAX_NVLS_ARITY 32 (src/include/device.h, 2.19 on, NVIDIA/nccl): the NVLS search keeps at
# most this many heads (src/graph/search.cc `ncclTopoCompute`: "NVLS and COLLNET_DIRECT search
# must have ngpus heads at most", maxChannels = min(NCCL_MAX_NVLS_ARITY, ngpus)), and NVLS
# reduce-scatter / all-gather are off past this many local ranks (src/enqueue.cc
# `updateCollCostTable`: func != AllReduce && localRanks > NCCL_MAX_NVLS_ARITY). Binds only on an
# MNNVL node (an NVL72 rack); an 8-GPU node never reaches it.
NVLS_MAX_ARITY = 32
NVLS_CHANNELS = 16  # NCCL_NVLS_NCHANNELS default: "NVLS should not need more than 16"
# Blackwell's NVLS CTAs, src/transport/nvls.cc (2.2x releases with SM100, `ncclNvlsInit`):
# NVLS_NCHANNELS_SM100_NVL 24 when every rank is on one node, NVLS_NCHANNELS_SM100 32 across
# nodes (NVLS_NCHANNELS_SM90 16 stays NVLS_CHANNELS above).
NVLS_CHANNELS_SM100 = {False: 24, True: 32}

# Bandwidth caps, GB/s, tuning.cc: index [arch][nodes] with nodes 1, 2, >2.
# llMaxBws: single node by GPU arch; with several nodes row 0 for Intel CPUs, 1 for AMD.
# Key 100 is the BLACKWELL_COMPCAP_IDX row of src/graph/tuning.cc@v2.27 (compCapIndex =
# minCompCap >= 100: sm100 and sm103 alike): "2*141.0, 2*45.0, 2*35.0", "2*36.7" ... as written
# there. sm80/sm90 keep 2.20.3's rows: 2.27.3's Hopper llMaxBws row is (141.0, 45.0, 35.0), and
# the formulas around the tables are 2.20.3's (see NCCL_VERSION_SM100 below).
LL_MAX_BW = {70: (39.0, 39.0, 20.4), 80: (87.7, 22.5, 19.0), 90: (87.7, 22.5, 19.0),
             100: (2 * 141.0, 2 * 45.0, 2 * 35.0)}
# Multi-node index1 is `cpuVendor == NCCL_TOPO_CPU_VENDOR_AMD ? 1 : 0` (tuning.cc, 2.20.3 at
# b6475625): an Arm CPU carries no vendor (src/graph/topo.cc `ncclTopoAddCpu` reads "vendor" only
# when arch is NCCL_TOPO_CPU_ARCH_X86; it stays NCCL_TOPO_UNDEF), so it reads Intel's row 0.
LL_MAX_BW_BY_CPU = {"intel": (39.0, 39.0, 20.4), "amd": (87.7, 22.5, 19.0),
                    "arm": (39.0, 39.0, 20.4)}
PER_CH_MAX_RING_LL128 = {70: (20.0,) * 3, 80: (20.0,) * 3, 90: (36.7,) * 3,
                         100: (2 * 36.7,) * 3}
PER_CH_MAX_TREE_LL128 = {70: (20.0,) * 3, 80: (20.0,) * 3, 90: (36.7, 36.7, 29.0),
                         100: (2 * 36.7, 2 * 36.7, 2 * 29.0)}
PER_CH_MAX_TREE = {70: (26.5, 18.5, 10.0), 80: (24.0, 23.6, 17.8), 90: (38.7, 41.4, 36.0),
                   100: (2 * 38.7, 2 * 41.4, 2 * 36.0)}
NCCL_VERSION_SM100 = "2.27"
"""Where the Blackwell tables come from (read from public copies of tuning.cc/search.cc of the
2.2x releases that carry a BLACKWELL_COMPCAP_IDX row; NVIDIA/nccl at the tag itself was not
reachable here, so the exact patch release is not pinned). Only tables are taken from it:
latencies (baseLat, hwLat), the bus-bandwidth formulas and the search stay 2.20.3's, so
sm80/sm90 predictions do not move. 2.27 differs there in ways this model does not follow:
ring LL busBw x 0.5 (2.20: 1/4 or 1/3), tree x 0.92 on all-reduce only and x 0.85 for the
tree pattern, NVLS hwLat 25 us (23)."""

# treeCorrectionFactor[proto][log2(bytes/64)], tuning.cc: "Trees are not perfectly sticking to
# the model for medium sizes"; powers of two from 64 B to 256 MiB, 1.0 beyond.
TREE_CORRECTION = {
    Proto.LL: (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
               1.0, 1.0, 1.0, 1.0),
    Proto.LL128: (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9,
                  .9, .9, .9, 1.0, 1.0),
    Proto.SIMPLE: (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7,
                   .7, .8, .9, .9),
}

# Network post overhead per step, getNetOverhead (tuning.cc): 1 us on Intel CPUs, 2 on AMD, and
# 1 on any CPU that is not x86 ("else return 1.0"): Arm (NVIDIA Grace on GB200/GB300 trays).
NET_OVERHEAD_S = {"intel": 1.0 * US, "amd": 2.0 * US, "arm": 1.0 * US}

# Chunking (src/include/collectives.h): ring all-reduce / all-gather / reduce-scatter with
# Simple move a chunk of 4 steps in 2 slices of 2 steps; broadcast moves 1 step per chunk.
CHUNK_STEPS_RING = 4  # ALLREDUCE_CHUNKSTEPS = NCCL_STEPS/2
SLICE_STEPS_RING = 2  # ALLREDUCE_SLICESTEPS = NCCL_STEPS/4
NVLS_CHUNK_BYTES = 128 << 10  # computeCollDevWork: maxChunkSize for NVLS (enqueue.cc)
