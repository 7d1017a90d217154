"""The pure lowering of a plan's communication: typed keys, sharing, channels, folded copies."""

import pytest

from sim.collectives import Collectives
from sim.engine.lowering import (
    CollectiveChannel,
    CollectiveKey,
    CommOp,
    TransferChannel,
    TransferKey,
    lower_communication,
)
from topology import build_cluster
from traces.errors import ConfigError
from traces.layout import Layout
from traces.ops import Op, OpKind, Trace

AR = OpKind.ALL_REDUCE
MiB = 2**20


def all_reduce(group, size=MiB):
    return Op(kind=AR, stream="dp", group=group, size_bytes=size)


def test_equal_ops_share_one_key_and_one_lowering_and_count_once(h100):
    send = Op(kind=OpKind.SEND, stream="s", peer=1, size_bytes=2 * MiB, tag="act")
    recv = Op(kind=OpKind.RECV, stream="r", peer=0, size_bytes=2 * MiB, tag="act")
    plan = Trace({0: (all_reduce((0, 1)), send, all_reduce((0, 1))),
                  1: (all_reduce((0, 1)), recv, all_reduce((0, 1)))})
    comm = lower_communication(plan, h100, None, algo="ring_flows")  # parasim's own ring
    assert [low.key for low in comm.lowered] == [CollectiveKey(AR, (0, 1), MiB),
                                                 TransferKey(0, 1, 2 * MiB)]
    assert [low.algo for low in comm.lowered] == ["ring_flows", "p2p"]
    col = Collectives(h100)
    assert comm.lowered[0].lowering == col.lowering(AR, (0, 1), "ring")  # no fold: unchanged
    assert comm.lowered[1].lowering == col.p2p(0, 1)
    assert comm.channels == (CollectiveChannel((0, 1)), TransferChannel(0, 1, "act"))
    # One issue counter per (channel, rank): the two all-reduces of a rank share one, and the
    # k-th call on it meets call k of the other rank.
    assert comm.num_queues == 4
    assert comm.ops[0][0] == comm.ops[0][2] == CommOp(lowered=0, channel=0, queue=0, need=2)
    assert comm.ops[1][0] == CommOp(lowered=0, channel=0, queue=2, need=2)
    assert comm.ops[0][1] == CommOp(lowered=1, channel=1, queue=1, need=2)
    assert comm.ops[1][1] == CommOp(lowered=1, channel=1, queue=3, need=2)
    assert comm.algorithms == {"ring_flows": 2, "p2p": 1}  # each collective and send counted once
    # Call numbers, per rank and op, in program order on each channel (shared CommOps, own
    # numbers): the all-reduces are calls 0 and 1 of the group, the transfer call 0 of its.
    assert list(comm.calls[0]) == list(comm.calls[1]) == [0, 0, 1]


def test_calls_are_numbered_in_program_order_across_the_streams_of_a_group(h100):
    def op(kind, stream, size):
        return Op(kind=kind, stream=stream, group=(0, 1), size_bytes=size)

    gather, scatter = OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER
    program = (op(gather, "zero_ag", MiB), op(scatter, "zero_rs", 2 * MiB),
               Op(kind=OpKind.COMPUTE, stream="compute", name="x"), op(gather, "zero_ag", MiB))
    comm = lower_communication(Trace({0: program, 1: program}), h100, None)
    assert comm.ops[0][0] is comm.ops[0][3]  # equal ops share their CommOp ...
    assert list(comm.calls[0]) == [0, 1, 0, 2]  # ... not their call number (compute: 0)


def test_folded_copies_add_their_flows_on_the_links_the_representative_uses():
    # One server per leaf at 2:1; TP 8 · DP 2 folds onto rank 0, whose DP all-reduce on
    # (0, 8) stands for the 8 rings (i, i + 8). On the links it uses, the lowered flow set must
    # carry the flows of all 8 rings together; on no other link may it put any.
    cluster = build_cluster("dgx-h100", nodes=2, nodes_per_leaf=1, oversubscription=2.0)
    fold = Layout(tp=8, dp=2, global_batch=2)
    comm = lower_communication(Trace({0: (all_reduce((0, 8)),)}), cluster, fold)
    (lowered,) = comm.lowered
    col = Collectives(cluster)
    rings = [col.lowering(AR, (i, i + 8), lowered.algo) for i in range(8)]
    # The representative's own lowering (`auto`: NCCL's choice, its protocol's bytes included).
    base = col.resolve(AR, (0, 8), lowered.key.size_bytes)[1]
    for k, rnd in enumerate(lowered.lowering):
        for j, (flows, factor) in enumerate(rnd):
            own = rings[0][k][j][0]
            assert factor == base[k][j][1]
            assert flows.links == own.links
            expected = {link: 0 for link in own.links}
            for ring in rings:
                twin = ring[k][j][0]
                for link, count in zip(twin.links, twin.counts):
                    if link in expected:
                        expected[link] += count
            assert dict(zip(flows.links, flows.counts)) == expected
            assert sum(flows.counts) > sum(own.counts)  # the uplinks are shared: copies count
    assert comm.ops[0][0].need == 1  # both members fold onto rank 0: it runs alone
    assert comm.algorithms == {lowered.algo: 1}


def test_copies_on_disjoint_links_leave_the_lowering_unchanged():
    cluster = build_cluster("dgx-h100", nodes=2, fabric="rail")
    fold = Layout(tp=2, dp=4, pp=2, global_batch=4)  # representatives 0 (pp 0) and 8 (pp 1)
    plan = Trace({0: (all_reduce((0, 2, 4, 6)),), 8: (all_reduce((8, 10, 12, 14)),)})
    comm = lower_communication(plan, cluster, fold, algo="ring_flows")
    col = Collectives(cluster)
    assert comm.lowered[0].lowering == col.lowering(AR, (0, 2, 4, 6), "ring")
    assert comm.lowered[1].lowering == col.lowering(AR, (8, 10, 12, 14), "ring")


@pytest.mark.parametrize(("plan", "needle"), [
    (Trace({0: (all_reduce((1, 2)),), 1: (), 2: ()}), "rank 0 issues all_reduce on group "
                                                      r"\[1, 2\] without being in it"),
    (Trace({9: ()}), "rank 9 does not exist"),
])
def test_bad_communication_is_a_clear_error(h100, plan, needle):
    with pytest.raises(ConfigError, match=needle):
        lower_communication(plan, h100, None)


def _p2p(kind, peer, size, tag="act", timed=False):
    times = {"start": 0.0, "end": 1e-3} if timed else {}
    return Op(kind=kind, stream="p2p", peer=peer, size_bytes=size, tag=tag, **times)


def test_a_send_and_the_receive_it_meets_must_move_the_same_bytes(h100):
    send, recv = OpKind.SEND, OpKind.RECV
    # The second send meets the second receive (k-th to k-th per source, destination, tag).
    plan = Trace({0: (_p2p(send, 1, MiB), _p2p(send, 1, 2 * MiB), _p2p(send, 1, 5, "x")),
                  1: (_p2p(recv, 0, 5, "x"), _p2p(recv, 0, MiB), _p2p(recv, 0, 3 * MiB))})
    with pytest.raises(ConfigError) as caught:
        lower_communication(plan, h100, None)
    assert str(caught.value) == ("trace: rank 1, op 2: recv of 3,145,728 B from rank 0 (tag "
                                 "'act', call #1) meets rank 0's op 1, a send of 2,097,152 B; a "
                                 "send and its receive move the same bytes")
    # A measured transfer of unstated size (0 B, timed) keeps its duration: no size to compare.
    unstated = Trace({0: (_p2p(send, 1, 0.0, timed=True),), 1: (_p2p(recv, 0, MiB, timed=True),)})
    lower_communication(unstated, h100, None)
    # A partial trace: the receive's sender is absent, nothing to compare it with.
    lower_communication(Trace({1: (_p2p(recv, 0, MiB),)}), h100, None)
