"""The `localhost` preset: the machine at hand as a one-host cluster of up to 8 CPU ranks."""

import pytest

from sim.config import example_path, load_experiment
from topology.config import build_cluster
from traces.errors import ConfigError


def test_ranks_are_processes_on_one_host_joined_by_loopback_links():
    cluster = build_cluster("localhost", gpus_per_node=4)
    assert cluster.num_devices == 4 and cluster.num_servers == 1
    assert set(cluster.link_kind) == {"loopback"}
    assert cluster.route(0, 3) and all(cluster.link_capacity[k] == 2e9
                                       for k in cluster.route(0, 3))


@pytest.mark.parametrize(("overrides", "message"), [
    ({"gpus_per_node": 9}, "cluster.gpus_per_node: 9 must be an integer from 1 to 8"),
    ({"nodes": 2}, "cluster.nodes: 2 must be an integer from 1 to 1"),
])
def test_at_most_eight_ranks_on_one_host(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_cluster("localhost", **overrides)


def test_the_shipped_cpu_example_is_a_four_rank_localhost_job():
    exp = load_experiment(example_path("gpt-tiny-localhost.toml"))
    assert exp.cluster.accelerator.name == "CPU-localhost"
    assert exp.layout.world == 4 and exp.model.dtype == "fp32"
