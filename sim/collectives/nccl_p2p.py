"""NCCL's all-to-all as NCCL runs it: grouped point-to-point sends and receives, one per peer.

NCCL has no all-to-all algorithm: since 2.12 `ncclAllToAll`-style code (nccl-tests'
alltoall, torch's `all_to_all_single`) is `ncclGroupStart`, a `ncclSend` and a `ncclRecv` per
peer, `ncclGroupEnd`, and one kernel runs them. What it costs, from NCCL's source (2.20-2.21;
`src/graph/paths.cc` `ncclTopoGetNchannels`, `ncclTopoComputeP2pChannels`; `src/enqueue.cc`
`scheduleP2pTasksToPlan`, `addP2pToPlan`):

  - **channels**: the communicator's p2p channels, `p2pnChannels` = pow2Up(min(nChannels,
    MAXCHANNELS 32)), and per peer `p2pnChannelsPerPeer` = pow2Up of the least over peers: an
    NVLink peer 2·(path bandwidth / one link's), a network peer NCHANNELS_PER_NET_PEER's 2,
    halved while 2·nRanks > 4·p2pnChannels ("avoid overloading channels with 8+ operations"),
    at least the NICs the GPU needs (one here). An op starts on nChannelsMin channels (the
    per-peer count halved while it times nRanks exceeds p2pnChannels), more for big messages
    (part size above one step), at most the per-peer count.
  - **protocol per peer**: LL when the message is at most nChannelsMax x NCCL_P2P_LL_THRESHOLD
    (16 KiB default) bytes, else Simple; LL puts 2 wire bytes per payload byte.
  - **latency**: every op of the group is a work item on its channels, and a channel runs its
    items one after another, so a channel pays one protocol step per peer op it serves:
    ceil((n - 1) x channels per op / p2pnChannels) of them (the network's step, `hwLat` NET,
    across nodes; NVLink's inside one), after the protocol's base latency (tuning.cc's ring
    figures, `sim.collectives.protocols`). The self copy is left out.
  - **PXN**: with every local GPU on NVLink (NCCL_PXN_DISABLE 0, the default since 2.12), a
    send to another server goes over NVLink to the local GPU on the receiver's rail and out of
    that rail's NIC: the routes the direct flows take (`sim.collectives.base.hop`), so on a rail
    fabric cross-rail bytes load the NVLink of the relaying GPU, never a spine.

  - **CTAs and warps (not a rate here)**: every p2p channel is one CTA of NCCL_MAX_NTHREADS
    640 threads (`scheduleP2pTasksToPlan`: plan->threadPerBlock = max(.., NCCL_MAX_NTHREADS));
    `ncclAddWorkBatchToPlan` batches up to NCCL_MAX_DEV_WORK_P2P_PER_BATCH 8 works (one per
    round, the self copy included unless in place) on a channel, and `src/device/sendrecv.h`
    splits the CTA's 20 warps evenly among a batch's works, each work's into (w-1)/2
    receiving and one more sending warps (`p2p_warps`, `channel_works`). Big messages grow an
    op to all p2pnChannelsPerPeer channels (parts above 32 steps), so at nccl-tests' large
    sizes every p2p channel is busy whatever the rank count (`busy_channels`). What one CTA
    moves over NVLink is the hardware's, in no NCCL source, so the flows still run at the
    links' rate (docs/alltoall-nvlink.md). In place, the self copy is skipped ("Skip send to
    self in-place", `scheduleP2pTasksToPlan`).

The bytes are the direct flows' (`sim.collectives.direct`, `sim.collectives.alltoallv` for an
uneven exchange), each class of peers carrying its own protocol's wire bytes and latency.
NCCL's own tuner does not model p2p; the times are this module's, from those mechanics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from sim.collectives.nccl_system import NcclSystem
from sim.collectives.protocols import NCCL_STEPS, PROTOCOLS, Algo, Hw, Proto
from sim.engine.flows import Lowering
from traces.alltoallv import AllToAllv

P2P = "p2p"
"""The name of NCCL's grouped sends in an algorithm label: `p2p/LL`, `p2p/Simple`."""

P2P_LL_THRESHOLD = 16384  # NCCL_PARAM(P2pLLThreshold, "P2P_LL_THRESHOLD", 16384), enqueue.cc
NET_PEER_CHANNELS = 2  # ncclTopoGetNchannels: "start from 2 channels per NIC" (paths.cc)
MAX_P2P_CHANNELS = 32  # NCCL_MAX_P2P_NCHANNELS default MAXCHANNELS
P2P_NET_CHUNK = 1 << 17  # NCCL_P2P_NET_CHUNKSIZE 128 KiB: Simple's step across nodes (init.cc)
P2P_NVL_CHUNK = 1 << 19  # NCCL_P2P_NVL_CHUNKSIZE 512 KiB: inside an all-NVLink node
LL_STEP = (1 << 19) // NCCL_STEPS  # DEFAULT_LL_BUFFSIZE 512 KiB over 8 steps, flags included


NCCL_MAX_NTHREADS = 640  # src/include/device.h: threads of a p2p CTA (enqueue.cc threadPerBlock)
WARP_SIZE = 32  # CUDA warp (src/include/device.h WARP_SIZE)
P2P_MAX_WORKS_PER_BATCH = 8  # NCCL_MAX_DEV_WORK_P2P_PER_BATCH (device.h): works a batch runs


def pow2_up(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


@dataclass(frozen=True, slots=True)
class P2pChannels:
    """A communicator's p2p channels (module docstring)."""

    total: int
    """p2pnChannels."""
    per_peer: int
    """p2pnChannelsPerPeer: the most channels one peer's op uses (nChannelsMax)."""
    per_op_min: int
    """nChannelsMin: what an op starts on."""


def p2p_channels(sys: NcclSystem) -> P2pChannels:
    """`ncclTopoComputeP2pChannels` and `scheduleP2pTasksToPlan`'s nChannelsMin."""
    n = sys.num_ranks
    total = pow2_up(min(sys.comm_channels, MAX_P2P_CHANNELS))
    least = total
    if sys.gpus_per_node > 1:  # NVLink peers: 2 x (path bandwidth / one link's) = 2 x links
        least = min(least, 2 * max(1, sys.nvlinks) if sys.nvswitch else 2)
    if sys.num_nodes > 1:
        net = NET_PEER_CHANNELS
        while net * n > total * 4 and net > 1:
            net //= 2
        least = min(least, max(1, net))
    per_peer = min(pow2_up(least), total)
    first = per_peer
    while first * n > total and first > 1:
        first //= 2
    return P2pChannels(total, per_peer, first)


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerPlan:
    """How NCCL sends one peer its message, and what the exchange's latency is for it."""

    peer_bytes: float
    protocol: Proto
    channels: int
    serial_ops: int
    """Peer ops each channel runs one after another."""
    latency_s: float
    wire_factor: float


def peer_plan(sys: NcclSystem, peer_bytes: float) -> PeerPlan:
    """`addP2pToPlan` for a message of `peer_bytes` in an all-to-all over `sys`."""
    ch = p2p_channels(sys)
    many = sys.num_nodes > 1
    proto = Proto.LL if peer_bytes <= ch.per_peer * P2P_LL_THRESHOLD else Proto.SIMPLE
    step = LL_STEP if proto is Proto.LL else (P2P_NET_CHUNK if many else P2P_NVL_CHUNK)
    smallest, largest = (step // 2, step) if many else (step // 8, step * 32)
    nc = max(1, min(ch.per_op_min, ceil(peer_bytes / smallest)))
    part = max(smallest, ceil(peer_bytes / nc))
    while part > largest and nc <= ch.per_peer // 2:
        nc *= 2
        part = ceil(peer_bytes / nc)
    serial = ceil((sys.num_ranks - 1) * nc / ch.total)
    p = PROTOCOLS[proto]
    hw = Hw.NET if many else (Hw.NVLINK if sys.nvswitch else Hw.PCI)
    latency = p.base_latency(Algo.RING) + serial * p.hop_latency(hw, Algo.RING)
    return PeerPlan(peer_bytes=peer_bytes, protocol=proto, channels=nc, serial_ops=serial,
                    latency_s=latency, wire_factor=p.wire_factor)


def p2p_lowering(sys: NcclSystem, flows: Lowering, size_bytes: float,
                 split: AllToAllv | None) -> tuple[str, Lowering]:
    """The direct flows (one round: one set, or one per per-peer size of `split`, in
    `split.classes()` order) with each set's NCCL latency and wire bytes; named after the
    protocol of the largest message ("p2p/Simple")."""
    (sets,) = flows
    sizes = [size_bytes / sys.num_ranks] if split is None else \
        [size for size, _ in split.classes()]
    assert len(sizes) == len(sets), "one flow set per per-peer size"
    plans = [peer_plan(sys, size) for size in sizes]
    rnd = tuple((replace(f, latency_s=p.latency_s), factor * p.wire_factor)
                for (f, factor), p in zip(sets, plans, strict=True))
    return f"{P2P}/{plans[-1].protocol}", (rnd,)


@dataclass(frozen=True, slots=True)
class P2pWarps:
    """Warps one p2p work (a send and a recv) gets in its channel's CTA."""

    send: int
    recv: int


def p2p_warps(works: int) -> P2pWarps:
    """`RunWorkBatch<ncclFuncSendRecv, .., NCCL_PROTO_SIMPLE>::run` (src/device/sendrecv.h,
    NCCL 2.24+) for a batch of `works`: nWarpPerWork = nWarps / nWorks; nRecvWarpPerWork =
    nWarpPerWork / 2 up to 4 warps, else (nWarpPerWork - 1) / 2; the send side as many up to
    4, else one more."""
    per_work = (NCCL_MAX_NTHREADS // WARP_SIZE) // works
    recv = per_work // 2 if per_work <= 4 else (per_work - 1) // 2
    return P2pWarps(send=recv if per_work <= 4 else recv + 1, recv=recv)


def busy_channels(sys: NcclSystem, peer_bytes: float) -> int:
    """The channels (CTAs) of one GPU that carry its sends to the n - 1 other ranks: each
    peer op striped over `peer_plan`'s channels, rounds on distinct channel bases
    (`ncclP2pChannelBaseForRound`) until all p2pnChannels are in use."""
    nc = peer_plan(sys, peer_bytes).channels
    return min(p2p_channels(sys).total, (sys.num_ranks - 1) * nc)


def channel_works(sys: NcclSystem, peer_bytes: float, in_place: bool = False) -> int:
    """Works one busy channel runs, the self copy one of the n ops unless `in_place`; a batch
    holds at most P2P_MAX_WORKS_PER_BATCH of them (`ncclAddWorkBatchToPlan`), so the warps
    each gets are `p2p_warps(min(works, 8))`."""
    ops = sys.num_ranks - (1 if in_place else 0)
    return ceil(ops * peer_plan(sys, peer_bytes).channels / p2p_channels(sys).total)
