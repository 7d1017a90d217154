"""Uneven all-to-all: flows counted by class equal flows routed pair by pair, bytes per link
equal the matrix's, nothing beats the links; NCCL's grouped sends, figure by figure."""

from __future__ import annotations

from collections import Counter

import pytest

from sim.collectives import Collectives, analytic_time
from sim.collectives.alltoallv import PairCache, counted, lower_alltoallv, routed
from sim.collectives.base import hop
from sim.collectives.nccl_p2p import P2pChannels, p2p_channels, peer_plan
from sim.collectives.protocols import Proto
from sim.engine.lowering import CollectiveKey, lower_communication
from tests.sim.collectives.test_alltoall import FABRICS
from topology.config import build_cluster
from traces.alltoallv import AllToAllv
from traces.ops import Op, OpKind, Trace

A2A = OpKind.ALL_TO_ALL
US = 1e-6


def _subsets(group: list[int]) -> list[tuple[list[int], list[int]]]:
    """(senders, receivers): one member to all, all to one, every third to every other
    second, and a scattered pair of sets."""
    return [([group[0]], group), (group, [group[-1]]), (group[::3], group[1::2]),
            (group[len(group) // 2:], group[: len(group) // 3 + 1])]


@pytest.mark.parametrize(("preset", "nodes", "table"), FABRICS)
def test_senders_to_receivers_counted_by_class_are_routed_pair_by_pair(preset, nodes, table):
    cluster = build_cluster(preset, nodes=nodes, **table)
    n, g = cluster.num_devices, cluster.devices_per_server
    for group in (list(range(n)), [r for r in range(n) if r % g in (1, 3, 6)]):
        for senders, receivers in _subsets(group):
            assert counted(cluster, senders, receivers) == dict(routed(cluster, senders,
                                                                       receivers))


def _link_bytes(cluster, group, split, size):
    """Bytes per link of every (source, destination) pair's route, from the matrix (0 for
    links only pairs of size 0 cross)."""
    out: Counter[int] = Counter()
    matrix = split.matrix()
    for i, a in enumerate(group):
        for j, b in enumerate(group):
            if a != b:
                for link in hop(cluster, a, b):
                    out[link] += matrix[i][j]
    return out


@pytest.mark.parametrize("by_sender", [False, True])
@pytest.mark.parametrize(("preset", "nodes", "table"), [FABRICS[2], FABRICS[4], FABRICS[6]])
def test_each_link_carries_the_matrix_bytes_and_the_time_never_beats_the_links(
        preset, nodes, table, by_sender):
    cluster = build_cluster(preset, nodes=nodes, **table)
    group = tuple(range(0, cluster.num_devices, 2))
    sizes = tuple(float((7 * k) % 5 * 1000 + 1000 * (k % 3 == 0)) for k in range(len(group)))
    split = AllToAllv(sizes, by_sender)
    size = split.mean_send_bytes
    lowering = lower_alltoallv(cluster, group, split)
    ((*sets,),) = lowering
    assert len(sets) == len(split.classes())
    got: Counter[float] = Counter()
    for flows, factor in sets:
        for link, count in zip(flows.links, flows.counts):
            got[link] += count * factor * size
    want = {link: b for link, b in _link_bytes(cluster, group, split, size).items() if b}
    assert set(got) == set(want)
    assert all(got[link] == pytest.approx(want[link], rel=1e-9) for link in want)
    latency = sets[0][0].latency_s
    bound = max(b / cluster.link_capacity[link] for link, b in want.items())
    assert analytic_time(cluster, lowering, size) >= latency + bound * (1 - 1e-12)


def test_nccls_p2p_channels_as_paths_cc_and_enqueue_cc_compute_them():
    col = Collectives(build_cluster("dgx-h100", nodes=128))
    one, four, eight = (col.nccl_system(tuple(range(n))) for n in (8, 32, 64))
    assert one is not None and four is not None and eight is not None
    # One node: 24 ring channels -> 32 p2p channels; NVLink peers 2 x 18 links = 36, so 32
    # per peer, an op starting on 32 / 2 / 2 / 2 = 4 (4 x 8 ranks <= 32).
    assert p2p_channels(one) == P2pChannels(32, 32, 4)
    # Four nodes: 16 channels; a network peer keeps 2 (2 x 32 <= 4 x 16); ops start on 1.
    assert p2p_channels(four) == P2pChannels(16, 2, 1)
    # Eight nodes (EP 64): 2 x 64 > 4 x 16 halves the network peers' channels to 1.
    assert p2p_channels(eight) == P2pChannels(16, 1, 1)
    assert peer_plan(eight, 16384).protocol is Proto.LL  # at most 1 x 16 KiB
    assert peer_plan(eight, 16385).protocol is Proto.SIMPLE
    assert peer_plan(four, 32768).protocol is Proto.LL  # 2 channels x 16 KiB
    # 1 MiB a peer on 64 ranks: Simple, one channel (one step is 128 KiB, the part may not
    # grow past it, but the per-peer cap is 1), 63 ops over 16 channels: 4 in a row, each a
    # network step of 14 us after Simple's 8.4 us.
    big = peer_plan(eight, 1 << 20)
    assert (big.channels, big.serial_ops) == (1, 4)
    assert big.latency_s == pytest.approx(8.4 * US + 4 * 14.0 * US, rel=1e-12)
    small = peer_plan(eight, 4096)
    assert small.latency_s == pytest.approx(6.6 * US + 4 * 2.7 * US, rel=1e-12)
    assert small.wire_factor == 2.0


def test_auto_runs_an_all_to_all_as_nccls_grouped_sends_on_the_direct_flows():
    cluster = build_cluster("dgx-h100", nodes=8, fabric="rail")
    group = tuple(range(64))
    col = Collectives(cluster)
    sys = col.nccl_system(group)
    assert sys is not None
    size = 64 * 2**20
    name, lowering = col.resolve(A2A, group, size)
    assert name == "p2p/Simple"
    direct = col.lowering(A2A, group, "direct")
    assert direct is not None
    ((flows, factor),), = direct
    plan = peer_plan(sys, size / 64)
    # The same flows (PXN routes over NVLink to the receiver's rail), NCCL's latency.
    assert analytic_time(cluster, lowering, size) == pytest.approx(
        plan.latency_s + factor * size / flows.solo_rate, rel=1e-12)
    assert col.lowering(A2A, group, name) == direct  # a folded copy's flows


def test_the_lowering_key_holds_the_split():
    cluster = build_cluster("dgx-h100", nodes=2)
    group = tuple(range(16))
    sizes = tuple(float(1000 * (1 + k % 4)) for k in range(16))
    split = AllToAllv(sizes, False)
    even = Op(kind=A2A, stream="compute", group=group, size_bytes=split.mean_send_bytes)
    uneven = Op(kind=A2A, stream="compute", group=group, size_bytes=split.mean_send_bytes,
                split=split)
    plan = Trace({r: (even, uneven) for r in group})
    comm = lower_communication(plan, cluster, None)
    assert [low.key for low in comm.lowered] == [
        CollectiveKey(A2A, group, split.mean_send_bytes),
        CollectiveKey(A2A, group, split.mean_send_bytes, split=split)]
    assert [len(low.lowering[0]) for low in comm.lowered] == [1, 4]  # one set per size
    assert all(low.algo.startswith("p2p/") for low in comm.lowered)


def test_a_shared_pair_cache_lowers_every_split_as_counting_afresh():
    """`lower_alltoallv` with one `PairCache` over many splits (size classes recurring, as
    a skewed MoE step's layers repeat them) gives each split the lowering a fresh count
    gives, and counts each (senders, receivers) once."""
    cluster = build_cluster("dgx-h100", nodes=2)
    group = tuple(range(0, cluster.num_devices, 2))
    cache = PairCache()
    splits = [AllToAllv(tuple(float(1 + (k * m) % 5) for m in range(len(group))), by_sender)
              for k in (1, 2, 3, 2, 1) for by_sender in (False, True)]
    for split in splits:
        assert lower_alltoallv(cluster, group, split, cache) == \
            lower_alltoallv(cluster, group, split)
    classes = {(split.by_sender, members) for split in splits for _, members in split.classes()}
    assert len(cache.pairs) == len(classes) and list(cache.whole) == [group]
