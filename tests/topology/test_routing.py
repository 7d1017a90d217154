"""`[cluster] routing`: destination-mod-k (today's, the default), ECMP's seeded 5-tuple hash
(flows that hash onto one spine uplink share it) and adaptive (spread by load)."""

from __future__ import annotations

from itertools import product

import pytest

from sim.engine.maxmin import max_min_rates
from sim.engine.replay import replay
from sim.models.compute import ComputeModel
from sim.profile import default_profile
from topology import build_cluster
from topology.fabric import flow_hash
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.plan import build


def a100(routing: str | None = None, **extra: object):
    # One server per leaf: every flow between servers climbs to one of 8 spines.
    table = {} if routing is None else {"routing": routing}
    return build_cluster("dgx-a100", nodes=4, fabric="fat-tree", nodes_per_leaf=1,
                         **table, **extra)


def spine(cluster, route):
    """The leaf -> spine link of a route."""
    ups = [link for link in route if cluster.link_ends[link][1].startswith("spine")]
    assert len(ups) == 1
    return ups[0]


def rates(cluster, routes):
    return max_min_rates([(r, [1] * len(r)) for r in routes], cluster.link_capacity)


def colliding_ecmp_pair(cluster):
    """Two flows from different NICs of server 0 to different servers that hash onto one
    spine uplink (8 uplinks, 64 candidates: a collision is certain)."""
    for j, k in product(range(8), range(8)):
        a, b = cluster.route(0, 8 + j), cluster.route(1, 16 + k)
        if spine(cluster, a) == spine(cluster, b):
            return (0, 8 + j), (1, 16 + k)
    raise AssertionError("no collision among 64 hashed pairs")


def test_dmodk_is_the_default_and_todays_route():
    default, dmodk = a100(), a100("dmodk")
    for src, dst in product(range(0, 32, 3), range(0, 32, 5)):
        assert default.route(src, dst) == dmodk.route(src, dst)
    # destination-mod-k: the uplink is the destination NIC's global index mod 8
    path = default.fabric.path(0, 8 + 3, None)
    assert path[3] == f"spine{(8 + 3) % 8}"


def test_ecmp_flows_hashed_onto_one_spine_link_share_it():
    cluster = a100("ecmp")
    first, second = colliding_ecmp_pair(cluster)
    routes = [cluster.route(*first), cluster.route(*second)]
    nic = cluster.link_capacity[routes[0][1]]  # the source NIC's link (PCIe is faster)
    assert rates(cluster, routes) == [pytest.approx(nic / 2)] * 2
    assert rates(cluster, routes[:1]) == [pytest.approx(nic)]


def test_adaptive_spreads_the_flows_that_collide_otherwise():
    # Same pair ECMP hashed together: adaptive routing puts them on two spines.
    first, second = colliding_ecmp_pair(a100("ecmp"))
    cluster = a100("adaptive")
    routes = [cluster.route(*first), cluster.route(*second)]
    assert spine(cluster, routes[0]) != spine(cluster, routes[1])
    nic = cluster.link_capacity[routes[0][1]]
    assert rates(cluster, routes) == [pytest.approx(nic)] * 2
    # destination-mod-k sends flows to NIC 3 of two servers through spine 3; adaptive does not
    dmodk, adaptive = a100("dmodk"), a100("adaptive")
    pair = [(0, 8 + 3), (1, 16 + 3)]
    assert len({spine(dmodk, dmodk.route(*f)) for f in pair}) == 1
    assert len({spine(adaptive, adaptive.route(*f)) for f in pair}) == 2


def test_routing_is_deterministic_and_seeded():
    one, two, other = a100("ecmp"), a100("ecmp"), a100("ecmp", routing_seed=12345)
    pairs = list(product(range(0, 8), range(8, 32, 3)))
    assert [one.route(s, d) for s, d in pairs] == [two.route(s, d) for s, d in pairs]
    assert [one.route(s, d) for s, d in pairs] != [other.route(s, d) for s, d in pairs]
    assert flow_hash(0, 1, 2) == flow_hash(0, 1, 2) != flow_hash(1, 1, 2)
    three, four = a100("adaptive"), a100("adaptive")
    assert [three.route(s, d) for s, d in pairs] == [four.route(s, d) for s, d in pairs]


MODEL = ModelSpec(layers=4, hidden=256, heads=16, seq_len=128, vocab=1024)


@pytest.mark.parametrize("routing", ["ecmp", "adaptive"])
def test_a_step_under_each_routing_is_deterministic_and_folds(routing):
    layout = Layout(tp=8, dp=2, global_batch=2)

    def step(ranks):
        cluster = build_cluster("dgx-h100", nodes=2, nodes_per_leaf=1, routing=routing,
                                oversubscription=2.0)
        model = ComputeModel(cluster.accelerator, default_profile(cluster.accelerator))
        return replay(build(MODEL, layout, ranks=ranks), cluster, model).step_time_s

    assert step(None) == step(None)
    assert step(layout.representatives()) == pytest.approx(step(None), rel=1e-9)


@pytest.mark.parametrize(("table", "needle"), [
    ({"routing": "random"}, "cluster.routing: 'random' is not one of dmodk, ecmp, adaptive"),
    ({"routing": 1}, "cluster.routing: 1 is not one of"),
    ({"routing_seed": -1}, "cluster.routing_seed: -1 must be"),
    ({"routing": "ecmp", "fabric": "rail"}, "cluster.routing: applies to fabric = \"fat-tree\""),
])
def test_bad_routing_is_refused(table, needle):
    with pytest.raises(ConfigError, match=None) as error:
        build_cluster("dgx-h100", nodes=2, **{"fabric": "fat-tree", **table})
    assert needle in str(error.value)


def test_bad_routing_on_the_command_line_is_one_line_exit_2(capsys, tmp_path):
    from sim.cli import main

    path = tmp_path / "c.toml"
    path.write_text("[model]\nlayers = 4\nhidden = 256\nheads = 16\nseq_len = 128\n"
                    "vocab = 1024\n[parallel]\ntp = 2\npp = 2\ndp = 4\nglobal_batch = 16\n"
                    '[cluster]\npreset = "dgx-h100"\nnodes = 2\nrouting = "spray"\n')
    code = main(["simulate", str(path)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    assert err == ("parasim: error: cluster.routing: 'spray' is not one of dmodk, ecmp, "
                   "adaptive\n")
