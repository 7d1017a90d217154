"""NCCL's p2p CTAs and warps for an all-to-all (`sim.collectives.nccl_p2p`): exact values of
sendrecv.h's warp split and the schedule's channel counts on an H100 NVSwitch node."""

from __future__ import annotations

import pytest

from sim.collectives.nccl_p2p import (
    NCCL_MAX_NTHREADS,
    WARP_SIZE,
    P2pWarps,
    busy_channels,
    channel_works,
    p2p_warps,
)
from sim.collectives.nccl_system import NcclSystem


def h100(ranks: int) -> NcclSystem:
    """One DGX H100 node (18 NVLinks a GPU): p2pnChannels 32, 32 channels a peer."""
    return NcclSystem(num_nodes=1, gpus_per_node=ranks, compute_capability=90, nvlinks=18)


@pytest.mark.parametrize(("works", "send", "recv"), [
    (1, 10, 9),  # 20 warps: recv (20-1)//2 = 9, send one more
    (2, 5, 4),   # 10 a work
    (3, 3, 2),   # 6 a work
    (4, 3, 2),   # 5 a work
    (5, 2, 2),   # 4 a work: halves
    (8, 1, 1),   # 2 a work
])
def test_p2p_warps_is_sendrecv_h_split(works: int, send: int, recv: int) -> None:
    assert NCCL_MAX_NTHREADS // WARP_SIZE == 20
    assert p2p_warps(works) == P2pWarps(send=send, recv=recv)
    assert send + recv <= 20 // works


def test_h100_4_ranks_500MB_runs_three_peers_on_eight_channels() -> None:
    """nccl#2169's run: 125 MB a peer over nChannelsMin 8 is 15.6 MB a part, under 32 steps of
    512 KiB (16 MiB), so an op stays on 8 channels: 3 peers x 8 = 24 CTAs, one work each."""
    sys, peer = h100(4), 500e6 / 4
    assert busy_channels(sys, peer) == 3 * 8
    assert channel_works(sys, peer) == 1 and channel_works(sys, peer, in_place=True) == 1


def test_big_messages_fill_every_p2p_channel() -> None:
    """8 ranks at 8 GiB: 1 GiB a peer grows each op from 4 to all 32 channels (parts above
    16 MiB), so all 32 CTAs run 8 works (7 peers and the self copy), 7 in place."""
    sys, peer = h100(8), (8 << 30) / 8
    assert busy_channels(sys, peer) == 32
    assert channel_works(sys, peer) == 8
    assert channel_works(sys, peer, in_place=True) == 7


def test_small_messages_keep_n_minus_1_times_channels_min() -> None:
    """8 ranks, 1 MiB a peer: nChannelsMin 4 (32 / 8), parts of 256 KiB stay on 4 channels."""
    sys = h100(8)
    assert busy_channels(sys, float(1 << 20)) == 7 * 4
    assert channel_works(sys, float(1 << 20)) == 1
