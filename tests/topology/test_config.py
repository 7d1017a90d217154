"""Loading clusters from [cluster] tables: overrides and one clear error per bad value."""

import pytest

from topology import build_cluster, cluster_from_table
from topology.config import load_cluster_file
from traces.errors import ConfigError


def test_overrides_replace_preset_fields():
    c = cluster_from_table({"preset": "dgx-a100", "nodes": 2, "nic_bandwidth": "400Gb/s",
                            "nvlink_bandwidth": "450GB/s", "nvlink_efficiency": 1.0,
                            "gpu_memory": "40G"})
    assert c.graph.edges["n0.nic0", "leaf0"]["bandwidth"] == pytest.approx(50e9 * 0.96)
    assert c.graph.edges["n0.gpu0", "n0.nvswitch"]["bandwidth"] == 450e9
    assert c.accelerator.memory_bytes == 40 * 2**30
    assert c.name == "dgx-a100 x2 fat-tree"


@pytest.mark.parametrize(("table", "message"), [
    ({"preset": "dgx-h100", "colour": "red"}, "cluster.colour: unknown key"),
    ({"preset": "dgx-b900"}, "cluster.preset: 'dgx-b900' is not a preset"),
    ({"preset": "dgx-h100", "fabric": "mesh"}, "cluster.fabric: 'mesh' is not a fabric"),
    ({"preset": "dgx-h100", "fabric": "torus"}, "does not fit preset 'dgx-h100'"),
    ({"preset": "dgx-h100", "nodes": 0}, "cluster.nodes: 0 must be at least 1"),
    ({"preset": "dgx-h100", "nodes": "4"}, "cluster.nodes: '4' must be an integer"),
    ({"preset": "dgx-h100", "nic_bandwidth": 0}, "cluster.nic_bandwidth: 0 must be a positive"),
    ({"preset": "dgx-h100", "nvlink_bandwidth": "-5GB/s"}, "cluster.nvlink_bandwidth"),
    ({"preset": "dgx-h100", "nvlink_latency": "fast"}, "nvlink_latency: 'fast' is not a time"),
    ({"preset": "dgx-h100", "nodes": 2, "nics_per_node": 0}, "n1.gpu0 is not connected to n0.gpu0"),
    ({"preset": "dgx-h100", "nodes": 2, "oversubscription": 3}, "oversubscription: 3 must divide"),
    ({"preset": "dgx-h100", "oversubscription": 0.5}, "cluster.oversubscription: 0.5 must be"),
    ({"preset": "dgx-h100", "tiers": 4}, "cluster.tiers: 4 must be one of 2, 3"),
    ({"preset": "dgx-h100", "nic_efficiency": 1.5}, "cluster.nic_efficiency: 1.5 must be a frac"),
    ({"preset": "tpu-v4", "dims": [4, 1, 4]}, "cluster.dims: [4, 1, 4] has a dimension < 2"),
    ({"preset": "tpu-v4", "dims": [64]}, "must have 2 or 3 dimensions"),
    ({"preset": "tpu-v4", "dims": [4, 4], "nodes": 3}, "cluster.nodes: 3 nodes of 4 chips"),
])
def test_each_bad_value_names_field_value_and_rule(table, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        cluster_from_table(table)


def test_toml_file_with_flag_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[cluster]\npreset = "dgx-h100"\nnodes = 4\nfabric = "rail"\n')
    c = load_cluster_file(path, {"nodes": 2})
    assert c.num_devices == 16 and c.fabric.kind == "rail"
    path.write_text("[cluster\npreset=")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_cluster_file(path)


def test_builders_are_deterministic():
    a, b = build_cluster("dgx-h100", nodes=3), build_cluster("dgx-h100", nodes=3)
    assert a.link_ends == b.link_ends and a.link_capacity == b.link_capacity
