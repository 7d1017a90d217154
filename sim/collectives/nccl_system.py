"""What NCCL sees of a machine: nodes, GPUs per node, link rates, and the channel graphs.

NCCL's tuning model does not read link rates directly: at init it searches *graphs* (rings,
trees, NVLS trees) over its topology and keeps, per algorithm, a number of channels and a
per-channel bandwidth (`nChannels`, `bwIntra`, `bwInter`). `graphs` reproduces the outcome of
that search (src/graph/search.cc, NCCL 2.20.3, `ncclTopoCompute`) for the machines parasim
models: GPUs on one NVSwitch per node, one NIC per GPU or fewer, nodes on InfiniBand.

    sys = NcclSystem(num_nodes=1, gpus_per_node=8, compute_capability=80, nvlinks=12,
                     nics_per_node=8, nic_Bps=25e9)
    sys.ring  # Graph(channels=12, bw_intra_Bps=20e9, ...), like NCCL on a DGX A100
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from sim.collectives.protocols import (
    GBPS,
    MAX_SEARCH_CHANNELS,
    NVLINK_LINE_BPS_BY_ARCH,
    NVLINK_LINK_BPS,
    NVLS_CHANNELS,
    NVLS_CHANNELS_SM100,
    NVLS_MAX_ARITY,
    SPEEDS_INTER,
    SPEEDS_INTRA,
)
from topology.cluster import Cluster
from topology.server import ServerSpec
from traces.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Graph:
    """One searched graph: `channels` parallel rings (or trees), each at these rates."""

    channels: int
    bw_intra_Bps: float
    bw_inter_Bps: float


@dataclass(frozen=True, kw_only=True)
class NcclSystem:
    """A communicator's view of its machine: the inputs of NCCL's tuning model."""

    num_nodes: int
    gpus_per_node: int
    """Ranks per node in the communicator (NCCL's ppn); all nodes alike."""
    compute_capability: int
    """80 for A100, 90 for H100/H200, 100 for B200/GB200, 103 for B300/GB300 (picks NCCL's
    per-arch constants; sm103 shares sm100's)."""
    nvlinks: int = 0
    """NVLink links per GPU to the NVSwitch (0: none; GPUs talk over PCIe)."""
    nics_per_node: int = 0
    nic_Bps: float = 0.0
    """Per NIC, per direction, as NCCL rates it (port speed / 8)."""
    cpu_vendor: str = "intel"
    """'intel', 'amd' or 'arm' (NVIDIA Grace): NCCL's multi-node LL cap and network overhead
    depend on it, and read Arm as Intel (`sim.collectives.protocols`)."""
    sharp: bool = False
    """The fabric reduces in the network (InfiniBand SHARP): enables CollNet."""

    def __post_init__(self) -> None:
        assert self.num_nodes >= 1 and self.gpus_per_node >= 1
        assert self.arch_index in NVLINK_LINK_BPS, "NCCL constants known for sm80/sm90/sm100"

    @property
    def num_ranks(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def nvswitch(self) -> bool:
        return self.nvlinks > 0 and self.gpus_per_node > 1

    @property
    def nvlink_Bps(self) -> float:
        """NCCL's NVLink data rate per GPU: links x SMxx_NVLINK_BW (A100 12 x 20 = 240 GB/s)."""
        return self.nvlinks * NVLINK_LINK_BPS[self.arch_index]

    @property
    def arch_index(self) -> int:
        """The per-arch key of NCCL's tables (`arch_index`)."""
        return arch_index(self.compute_capability)

    @property
    def node_index(self) -> int:
        """NCCL's index2: 0 for one node, 1 for two, 2 for more."""
        return min(self.num_nodes, 3) - 1

    @cached_property
    def ring(self) -> Graph:
        """Ring graph: NCCL_TOPO_PATTERN_RING."""
        return self._intra_graph() if self.num_nodes == 1 else self._inter_graph()

    @cached_property
    def tree(self) -> Graph:
        """Tree graph. Inside one NVSwitch node the search lands on the ring's answer (a chain
        through the switch uses each GPU's links as a ring does); across nodes one tree per
        NIC, like the rings."""
        return self.ring

    @cached_property
    def nvls(self) -> Graph | None:
        """NVLS graph (sm90 with NVSwitch): one channel per head GPU, at most
        NCCL_MAX_NVLS_ARITY (32) heads. Every GPU's link carries each channel once and its own
        head's twice: (heads + 1) x bw <= link, so on H100 (370.8 GB/s, n = 8) the search
        settles at 40 GB/s; `bwInter` is then raised in pass 2 to the top speed below
        2 x bwIntra (60). An NVL72 rack (MNNVL, 72 GPUs) keeps 32 heads: 33 x bw <= 721.8."""
        if self.compute_capability < 90 or not self.nvswitch:
            return None
        n = self.gpus_per_node
        if self.arch_index >= 100 and n <= 2:  # ncclNvlsInit: no NVLS with gpuCount <= 2
            return None
        heads = min(n, NVLS_MAX_ARITY)  # minChannels = maxChannels = min(arity, ngpus)
        speeds = SPEEDS_INTRA[self.arch_index]
        total = self.nvlink_Bps / GBPS * n / (n - 1)  # non-ring patterns: totalBw * n/(n-1)
        start = next((s for s in speeds if s * heads <= total), None)
        bw = next((s for s in speeds if start is not None and s <= start
                   and (heads + 1) * s <= self.nvlink_Bps / GBPS), None)
        if bw is None:  # no speed fits so many GPUs: the search fails and NCCL has no NVLS
            return None
        inter = max(s for s in speeds if s < 2 * bw)
        if self.num_nodes > 1:
            inter = self._nic_speed()
        return Graph(heads, bw * GBPS, inter * GBPS)

    @property
    def nvls_channels(self) -> int:
        """CTAs an NVLS collective launches: 16 on sm90; on Blackwell 24 inside one node, 32
        across nodes (ncclNvlsInit's multiNode)."""
        if self.arch_index >= 100:
            return NVLS_CHANNELS_SM100[self.num_nodes > 1]
        return NVLS_CHANNELS

    @cached_property
    def collnet(self) -> Graph | None:
        """CollNet graph: one channel per NIC at the NIC's rate (SHARP fabrics only)."""
        if not self.sharp or self.num_nodes == 1 or not self.nics_per_node:
            return None
        speed = self._nic_speed() * GBPS
        return Graph(self.nics_per_node, speed, speed)

    @property
    def comm_channels(self) -> int:
        """Channels a collective may use: the ring graph's, duplicated (ncclTopoPostset in
        src/graph/connect.cc doubles the search channels; 24 on a DGX A100)."""
        return min(2 * self.ring.channels, 2 * MAX_SEARCH_CHANNELS)

    def _intra_graph(self) -> Graph:
        """The search on one NVSwitch node, in closed form.

        Pass 1 tries speeds from the top (`sm80`: 40, 30, 20 GB/s ...; `sm90`: 60, 50, 40 ...)
        and keeps the best channels x speed, first found on ties, where every channel takes
        `speed` on each GPU's NVLink. Then `ncclTopoDupChannels` doubles the channels at half
        the speed when speed >= 25 (on sm90 only if speed >= 50 or channels <= 4). Pass 2
        raises the speed at fixed channels while it still fits.
        DGX A100: 240 GB/s -> 6 x 40 -> 12 x 20. DGX H100: 370.8 -> 6 x 60 -> 12 x 30.
        """
        if not self.nvswitch:
            return Graph(1, self.nvlink_Bps or 12 * GBPS, self.nvlink_Bps or 12 * GBPS)
        cc = self.arch_index
        total = self.nvlink_Bps / GBPS
        speeds = SPEEDS_INTRA[cc]
        best = (0, 0.0)
        for speed in speeds:
            if speed > total:
                continue
            if best[0] and speed / best[1] <= 0.49:  # "decrease bw until we find a solution"
                break
            channels = min(int(total // speed + 1e-9), MAX_SEARCH_CHANNELS)
            if channels * speed > best[0] * best[1]:
                best = (channels, speed)
            if channels * speed >= total:
                break
        channels, speed = best
        if speed >= 25 and not (cc > 80 and speed < 50 and channels > 4):
            doubled = min(2 * channels, MAX_SEARCH_CHANNELS)
            speed /= -(-doubled // channels)
            channels = doubled
        faster = [s for s in speeds if s > speed and channels * s <= total]
        if faster:
            speed = min(faster)
        return Graph(channels, speed * GBPS, speed * GBPS)

    def _inter_graph(self) -> Graph:
        """Rings across nodes: one channel per NIC at the NIC's speed from NCCL's list
        (HDR 25 GB/s -> 24; NDR 50 GB/s -> 48), the same speed inside the node (the search
        sets bwIntra = bwInter). No duplication below 25 GB/s, nor on sm90 below 50 with more
        than 4 channels; NCCL logs 16 channels on 8-NIC DGX H100 clusters (nccl#1453)."""
        if not self.nics_per_node:
            raise ConfigError("nccl: nodes without NICs cannot form a multi-node ring")
        speed = self._nic_speed()
        channels = min(self.nics_per_node, MAX_SEARCH_CHANNELS)
        return Graph(channels, speed * GBPS, speed * GBPS)

    def _nic_speed(self) -> float:
        nic = self.nic_Bps / GBPS
        speeds = SPEEDS_INTER[self.arch_index]
        return next((s for s in speeds if s <= nic + 1e-9), speeds[-1])


# GB200/GB300 NVL72: 72 GPUs a rack on one NVLink domain, four per compute tray, each tray one OS
# host with its own NICs (GB200 NVL72 reference design, topology/presets.py). NCCL's host is a
# tray; its MNNVL "node" is the rack (see `system_for`).
NVL72_TRAY_GPUS = 4
NVL72_GPUS = 72
# The trays' CPU is NVIDIA Grace (Arm Neoverse V2; GB200/GB300 NVL72 spec: 36 Grace CPUs for 72
# GPUs). NCCL types it NCCL_TOPO_CPU_ARCH_ARM (3; src/include/graph.h beside
# NCCL_TOPO_CPU_VENDOR_INTEL 1 and _AMD 2) with no vendor (`ncclTopoAddCpu` reads one on x86 only).
GRACE = "arm"


def arch_index(compute_capability: int) -> int:
    """The per-arch key of NCCL's tables: sm103 reads sm100's (tuning.cc's compCapIndex is
    BLACKWELL for minCompCap >= 100; topo.h's SM100_NVLINK_BW for cudaCompCap >= 100)."""
    return 100 if compute_capability >= 100 else compute_capability


def compute_capability(accelerator_name: str) -> int:
    """NCCL's arch key from the accelerator's name (A100 -> 80; H100, H200 -> 90; B200, GB200
    -> 100; B300, GB300 -> 103: CUDA's compute capabilities 10.0 and 10.3)."""
    name = accelerator_name.upper()
    if "B300" in name:
        return 103
    if "B200" in name:
        return 100
    if "H100" in name or "H200" in name or "H800" in name or "H20" in name:
        return 90
    if "A100" in name or "A800" in name:
        return 80
    raise ConfigError(f"nccl: no NCCL model for accelerator {accelerator_name!r} "
                      "(known: A100, H100, H200, B200, GB200, B300, GB300)")


def system_for(cluster: Cluster, group: tuple[int, ...], *, sharp: bool | None = None,
               cpu_vendor: str | None = None) -> NcclSystem:
    """NCCL's view of `group` on `cluster` (an NVSwitch/InfiniBand GPU cluster).

    `sharp` (CollNet available) defaults to the fabric's `[cluster] sharp` key.

    Ranks must spread evenly over their nodes, as NCCL's model assumes. NVLink links per GPU
    are the line rate over a link's (25 GB/s NVLink 3/4: A100 300 GB/s -> 12, H100 450 GB/s
    -> 18; 50 GB/s NVLink 5: B200 900 GB/s -> 18).

    A GB200/GB300 NVL72 rack is NCCL's multi-node NVLink (MNNVL): one host per 4-GPU tray, one
    NVLink domain for the rack. NCCL fuses the topologies of a clique's ranks into one system
    (src/graph/topo.cc `ncclTopoGetSystem`: under comm->MNNVL the ranks fused are
    comm->clique.ranks, not the host's) and counts a node per distinct first rank of the ring
    graph (src/init.cc, nodesFirstRank), so a group inside one rack is one node of len(group)
    GPUs behind the NVLink switch trays, and a group across racks has one node per rack, each
    with the NICs of the trays its ranks sit on (`mnnvl_nics`). The rack is the cluster's
    server: a `gpus_per_node` cut of the rack is its own NVLink domain, as the flow model
    routes it. (NVIDIA/nccl topo.cc@069a3d4f for the fusion; the clique is the ranks of one
    NVLink fabric cliqueId, init.cc `checkMNNVL`, NCCL_MNNVL_ENABLE 2 = on when the clique
    has more than one rank.) This is the tuning of the 2.2x releases that know Blackwell
    (tuning.cc with BLACKWELL_COMPCAP_IDX: nNodes = comm->nNodes, NVLS off only across
    nodes without CollNet); 2.20.3 (b6475625) instead tuned any MNNVL communicator as one node
    ("MNNVL support - treat as a single NVLink connected node") and disabled NVLS under MNNVL,
    but runs no sm100.
    """
    server = getattr(cluster.fabric, "server", None)
    if server is None:
        raise ConfigError(f"nccl: {cluster.name} is not a switched GPU cluster")
    per_node: dict[int, int] = {}
    for rank in group:
        per_node[cluster.server_of(rank)] = per_node.get(cluster.server_of(rank), 0) + 1
    if len(set(per_node.values())) != 1:
        raise ConfigError(f"nccl: group of {len(group)} has uneven ranks per node "
                          f"({sorted(per_node.values())})")
    cc = compute_capability(cluster.accelerator.name)
    nvlinks = round(server.nvlink_Bps / NVLINK_LINE_BPS_BY_ARCH[arch_index(cc)])
    mnnvl = cluster.accelerator.name.upper().startswith("GB")  # GB200/GB300 NVL72
    return NcclSystem(num_nodes=len(per_node), gpus_per_node=len(group) // len(per_node),
                      compute_capability=cc,
                      nvlinks=nvlinks,
                      nics_per_node=mnnvl_nics(cluster, server, group) if mnnvl else server.nics,
                      nic_Bps=server.nic_Bps,
                      cpu_vendor=cpu_vendor or host_cpu(cluster.accelerator.name),
                      sharp=bool(getattr(cluster.fabric, "sharp", False)) if sharp is None
                      else sharp)


def host_cpu(accelerator_name: str) -> str:
    """NCCL's CPU vendor of the GPUs' hosts: AMD EPYC on DGX A100, Intel Xeon on DGX
    H100/H200/B200/B300, NVIDIA Grace (Arm) on GB200/GB300 trays."""
    name = accelerator_name.upper()
    if name.startswith("GB"):
        return GRACE
    return "amd" if "A100" in name else "intel"


def mnnvl_nics(cluster: Cluster, server: ServerSpec, group: tuple[int, ...]) -> int:
    """NICs of one MNNVL node: those of the trays that hold the group's ranks in its rack.

    Each rank's topology lists its own host's NICs and NCCL fuses only the clique's ranks
    (`system_for`), so a rack's node has the NICs of the trays its ranks sit on, a tray the
    rack's NICs over its 18 trays (72 ConnectX a rack: four a tray). Where racks differ, the
    fewest: NCCL aligns every graph to its minimum over ranks (src/init.cc, after
    AllGather3). Inside one rack they move nothing: NCCL trims the NICs away when the system
    holds every rank (src/graph/paths.cc `ncclTopoTrimSystem`).
    """
    per_tray = server.nics * NVL72_TRAY_GPUS // NVL72_GPUS
    trays: dict[int, set[int]] = {}
    for rank in group:
        local = rank % cluster.devices_per_server
        trays.setdefault(cluster.server_of(rank), set()).add(local // NVL72_TRAY_GPUS)
    return min(len(t) for t in trays.values()) * per_tray
