"""Loading clusters from [cluster] tables: overrides and one clear error per bad value."""

import math
import re

import pytest

from topology import build_cluster, cluster_from_table
from topology.config import load_cluster_file, read_cluster
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
    ({"preset": "dgx-h100", "nodes": 0}, "cluster.nodes: 0 must be an integer from 1 to 131,072"),
    ({"preset": "dgx-h100", "nodes": "4"}, "cluster.nodes: '4' must be an integer"),
    ({"preset": "dgx-h100", "nic_bandwidth": 0}, "cluster.nic_bandwidth: 0 must be a positive"),
    ({"preset": "dgx-h100", "nvlink_bandwidth": "-5GB/s"}, "cluster.nvlink_bandwidth"),
    ({"preset": "dgx-h100", "nvlink_latency": "fast"}, "nvlink_latency: 'fast' is not a time"),
    ({"preset": "dgx-h100", "nodes": 2, "nics_per_node": 0}, "n1.gpu0 is not connected to n0.gpu0"),
    ({"preset": "dgx-h100", "nodes": 2, "oversubscription": 3}, "oversubscription: 3 must divide"),
    ({"preset": "dgx-h100", "oversubscription": 0.5}, "cluster.oversubscription: 0.5 must be"),
    ({"preset": "dgx-h100", "tiers": 4}, "cluster.tiers: 4 is not one of 2, 3"),
    ({"preset": "dgx-h100", "nic_efficiency": 1.5},
     "cluster.nic_efficiency: 1.5 must be a link efficiency in [0.01, 1]"),
    ({"preset": "tpu-v4", "dims": [4, 1, 4]}, "cluster.dims: [4, 1, 4] must hold integers from 2"),
    ({"preset": "tpu-v4", "dims": [64]}, "cluster.dims: [64] must be a list of 2 or 3 integers"),
    ({"preset": "tpu-v4", "dims": [4, 4], "nodes": 3}, "cluster.nodes: 3 nodes of 4 chips"),
    ({"preset": "dgx-h100", "sharp": "yes"}, "cluster.sharp: 'yes' must be true or false"),
    ({"preset": "dgx-h100", "sharp": 1}, "cluster.sharp: 1 must be true or false"),
    ({"preset": "tpu-v4", "sharp": True}, "cluster.sharp: applies to a switched"),
])
def test_each_bad_value_names_field_value_and_rule(table, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        cluster_from_table(table)


def test_sharp_is_a_property_of_the_switched_fabric():
    assert build_cluster("dgx-h100", nodes=2).fabric.sharp is False
    for fabric in ("fat-tree", "rail"):
        assert build_cluster("dgx-h100", nodes=2, fabric=fabric, sharp=True).fabric.sharp


def test_toml_file_with_flag_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[cluster]\npreset = "dgx-h100"\nnodes = 4\nfabric = "rail"\n')
    c = load_cluster_file(path, {"nodes": 2})
    assert c.num_devices == 16 and c.fabric.kind == "rail"
    path.write_text("[cluster\npreset=")
    with pytest.raises(ConfigError, match=r"--cluster: .*c\.toml: not valid TOML: Expected"):
        load_cluster_file(path)


# Issue 6: values a hostile or careless user wrote that were accepted, hung or blew up memory.
@pytest.mark.parametrize(("table", "message"), [
    # non-finite or beyond float range: a hang in the network's re-share, or a silent wrong answer
    ({"nvlink_latency": math.inf}, "cluster.nvlink_latency: inf is not a finite number"),
    ({"nvlink_latency": "1e400s"}, "cluster.nvlink_latency: '1e400s' is not a finite number"),
    ({"switch_latency": "1e400s"}, "cluster.switch_latency: '1e400s' is not a finite number"),
    ({"preset": "tpu-v4", "link_latency": math.inf}, "cluster.link_latency: inf is not a finite"),
    ({"nvlink_latency": "2s"}, "cluster.nvlink_latency: '2s' must be from 0 s to 1 s"),
    ({"nic_bandwidth": math.inf}, "cluster.nic_bandwidth: inf is not a finite number"),
    ({"nic_bandwidth": "1e400GB/s"}, "cluster.nic_bandwidth: '1e400GB/s' is not a finite"),
    ({"nic_bandwidth": 1e-300}, "cluster.nic_bandwidth: 1e-300 must be from 1 MB/s to 100 TB/s"),
    ({"hbm_bandwidth": "1PB/s"}, "cluster.hbm_bandwidth: '1PB/s' is not a bandwidth"),
    ({"hbm_bandwidth": "1000TB/s"}, "cluster.hbm_bandwidth: '1000TB/s' must be from 1 MB/s"),
    ({"gpu_peak_tflops": math.inf}, "cluster.gpu_peak_tflops: inf must be at least 0.001 TFLOP/s"),
    ({"gpu_peak_tflops": 1e-300}, "cluster.gpu_peak_tflops: 1e-300 must be at least 0.001"),
    ({"gpu_peak_tflops": 10**400}, "cluster.gpu_peak_tflops: 1000000000...00000000000 must be"),
    ({"gpu_memory": 10**400}, "cluster.gpu_memory: 1000000000...00000000000 is too large"),
    ({"gpu_memory": "1000T"}, "cluster.gpu_memory: '1000T' is too large"),
    ({"nvlink_efficiency": True},
     "cluster.nvlink_efficiency: True must be a link efficiency in [0.01, 1] (the share of the "
     "line rate that carries data)"),
    # an integer is an integer: not a float that equals one, not a bool
    ({"tiers": 2.0}, "cluster.tiers: 2.0 is not one of 2, 3"),
    ({"nodes": 2.0}, "cluster.nodes: 2.0 must be an integer"),
    ({"nodes": True}, "cluster.nodes: True must be an integer"),
    # unhashable values where a name belongs
    ({"preset": ["dgx-h100"]}, "cluster.preset: ['dgx-h100'] is not a preset"),
    ({"fabric": {"kind": "rail"}}, "cluster.fabric: {'kind': 'rail'} is not a fabric"),
    # sizes checked before anything is built
    ({"nodes": 1_000_000}, "cluster.nodes: 1000000 must be an integer from 1 to 131,072"),
    ({"nodes": 10**30}, "cluster.nodes: 1000000000...00000000000 must be an integer from 1"),
    ({"nodes": 20_000}, "cluster.nodes: 20,000 nodes x 8 accelerators = 160,000, more than"),
    ({"gpus_per_node": 10**7}, "cluster.gpus_per_node: 10000000 must be an integer from 1 to"),
    ({"preset": "tpu-v4", "dims": [100, 100, 100]}, "a 100x100x100 torus holds 1,000,000 chips"),
    ({"nodes": 4, "nodes_per_leaf": 4096}, "4096 nodes x 8 NICs = 32,768 ports on one leaf"),
    # keys that do not apply are errors, not ignored
    ({"dims": [4, 4]}, "cluster.dims: applies to a torus preset only, not to preset 'dgx-h100'"),
    ({"fabric": "rail", "tiers": 3}, "cluster.tiers: applies to fabric = \"fat-tree\" only"),
    ({"preset": "tpu-v4", "nic_bandwidth": "1GB/s"}, "cluster.nic_bandwidth: applies to a "
                                                     "switched (DGX) preset only"),
])
def test_hostile_values_are_one_line_errors(table, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        cluster_from_table({"preset": "dgx-h100", **table})
    assert "\n" not in str(caught.value)


def test_the_size_is_known_before_building():
    spec = read_cluster({"preset": "dgx-a100", "nodes": 128})
    assert spec.num_devices == 1024 and spec.devices_per_server == 8
    torus = read_cluster({"preset": "tpu-v4", "dims": [4, 8, 8]})
    assert torus.num_devices == 256 and torus.nodes == 64
    assert torus.build().num_devices == 256


def test_builders_are_deterministic():
    a, b = build_cluster("dgx-h100", nodes=3), build_cluster("dgx-h100", nodes=3)
    assert a.link_ends == b.link_ends and a.link_capacity == b.link_capacity
