"""`[cluster] qps_per_connection`: a connection's queue pairs hashed apart by ECMP, each
carrying an even share of its bytes (NCCL_IB_QPS_PER_CONNECTION)."""

from __future__ import annotations

from collections import Counter
from itertools import product

import pytest
import simpy

from sim.collectives.base import flowset, hop
from sim.engine.network import Network
from topology import build_cluster
from topology.fabric import flow_hash
from traces.errors import ConfigError

NIC = 24e9  # dgx-a100's 200 Gb/s NIC at its efficiency: the uplinks' rate too (PCIe 32 GB/s)
UPLINKS = 8  # one server per leaf: its 8 NIC ports, 8 uplinks at 1:1


def a100(qps: int, routing: str = "ecmp", nodes: int = 2):
    return build_cluster("dgx-a100", nodes=nodes, fabric="fat-tree", nodes_per_leaf=1,
                         routing=routing, qps_per_connection=qps)


def eight_flows(cluster):
    """GPU i of server 0 to GPU i of server 1, i = 0..7: each on NIC i at both ends, all up
    through leaf 0's eight uplinks."""
    return flowset(cluster, [hop(cluster, i, 8 + i) for i in range(8)], 0.0)


@pytest.mark.parametrize("qps", [1, 2, 4, 16])
def test_spread_time_is_the_closed_form_of_the_hash(qps):
    # Each of the 8 flows' qps queue pairs goes up uplink flow_hash(seed 0, NIC i, NIC 8+i,
    # qp) mod 8; every queue pair moves B / qps at the rate of its busiest link: its own
    # NIC (qps queue pairs) or the most loaded uplink.
    load = Counter(flow_hash(0, i, 8 + i, j) % UPLINKS for i in range(8) for j in range(qps))
    size = 1e9
    expected = size / qps * max(qps, max(load.values())) / NIC
    flows = eight_flows(a100(qps))
    assert flows.qps == qps
    assert flows.solo_time(size) == pytest.approx(expected, rel=1e-12)
    # never faster than the uplinks can carry the eight flows
    assert flows.solo_time(size) >= 8 * size / (UPLINKS * NIC) * (1 - 1e-12)


def test_more_queue_pairs_spread_what_one_queue_pair_collides():
    one, sixteen = eight_flows(a100(1)), eight_flows(a100(16))
    size = 1e9
    collided = max(Counter(flow_hash(0, i, 8 + i) % UPLINKS for i in range(8)).values())
    assert collided > 1  # 8 flows on 8 uplinks by hash: some share one
    assert one.solo_time(size) == pytest.approx(collided * size / NIC)
    assert sixteen.solo_time(size) < one.solo_time(size)


def test_one_queue_pair_is_todays_route_and_flow_set():
    default = build_cluster("dgx-a100", nodes=4, fabric="fat-tree", nodes_per_leaf=1,
                            routing="ecmp")
    one = a100(1, nodes=4)
    assert default.qps == one.qps == 1
    for src, dst in product(range(0, 32, 3), range(0, 32, 5)):
        assert default.route(src, dst) == one.route(src, dst)
    assert eight_flows(default) == eight_flows(one)


def test_queue_pairs_do_not_spread_where_routes_are_not_hashed():
    # destination-mod-k puts every queue pair of a connection on one path: nothing to split
    assert a100(16, routing="dmodk").qps == 1
    assert eight_flows(a100(16, routing="dmodk")) == eight_flows(a100(1, routing="dmodk"))


def test_the_flow_engine_moves_a_spread_set_in_its_closed_form_time():
    cluster = a100(4)
    flows = eight_flows(cluster)
    size = 3e8
    net = Network(simpy.Environment(), cluster.link_capacity, analytic_path=False)
    done = []

    def go():
        yield net.run(net.register((((flows, 1.0),),)), size)
        done.append(net.env.now)

    net.env.process(go())
    net.env.run()
    assert done == [pytest.approx(flows.solo_time(size), rel=1e-12)]


def test_nvlink_flows_cost_the_same_with_queue_pairs():
    # inside a server there are no queue pairs to hash: counts q-fold, bytes 1/q each
    one, four = a100(1), a100(4)
    within = [(hop(c, 0, 1),) for c in (one, four)]
    size = 1e9
    assert flowset(four, within[1], 0.0).solo_time(size) == pytest.approx(
        flowset(one, within[0], 0.0).solo_time(size), rel=1e-12)


def test_bounds():
    with pytest.raises(ConfigError, match="qps_per_connection"):
        a100(0)
    with pytest.raises(ConfigError, match="qps_per_connection"):
        a100(129)
