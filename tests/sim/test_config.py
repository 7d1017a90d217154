"""Experiments and profiles are valid once constructed: the model x layout x cluster rules are
checked in one place (`Experiment`), profiles through the typed reader."""


import pytest

from sim.config import EXAMPLES, Experiment, example_path, experiment_from_dict, load_experiment
from sim.profile import default_profile
from topology import build_cluster
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec

MODEL = ModelSpec(layers=4, hidden=256, heads=16, seq_len=128, vocab=1024)


@pytest.fixture(scope="module")
def h100():
    return build_cluster("dgx-h100", nodes=1)


def experiment(cluster, **changes):
    values = {"name": "x", "model": MODEL, "layout": Layout(tp=2, dp=4, global_batch=8),
              "cluster": cluster, "profile": default_profile(cluster.accelerator), **changes}
    return Experiment(**values)


def test_an_experiment_checks_its_parts_together(h100):
    assert experiment(h100).layout.world == h100.num_devices
    with pytest.raises(ConfigError, match="= 4 ranks, but the cluster has 8 GPUs"):
        experiment(h100, layout=Layout(tp=2, dp=2, global_batch=8))
    with pytest.raises(ConfigError, match=r"parallel\.tp: 16 is larger than a node"):
        experiment(build_cluster("dgx-h100", nodes=2), layout=Layout(tp=16, global_batch=1))
    with pytest.raises(ConfigError, match=r"sim\.network: 'fast' is not one of flow"):
        experiment(h100, network="fast")
    with pytest.raises(ConfigError, match=r"sim\.algo: '' is not one of auto"):
        experiment(h100, algo="")


def test_notes_for_slow_layouts_are_kept_on_the_experiment():
    six = build_cluster("dgx-h100", nodes=2, gpus_per_node=6)  # 12 GPUs, 6 per node
    exp = experiment(six, layout=Layout(tp=4, dp=3, global_batch=3))
    assert len(exp.warnings) == 1 and "some TP groups cross nodes" in exp.warnings[0]


@pytest.mark.parametrize("name", EXAMPLES)
def test_shipped_examples_load(name):
    exp = load_experiment(example_path(name))
    assert exp.layout.world == exp.cluster.num_devices and exp.warnings == ()


def test_bucket_bytes_read_in_human_units():
    data = {"model": {"layers": 4, "hidden": 256, "heads": 16, "seq_len": 128, "vocab": 1024},
            "parallel": {"dp": 8, "global_batch": 8, "bucket_bytes": "16M"},
            "cluster": {"preset": "dgx-h100"}}
    assert experiment_from_dict(data).layout.bucket_bytes == 16 * 2**20
    data["parallel"]["bucket_bytes"] = 1.5e6
    with pytest.raises(ConfigError, match=r"parallel\.bucket_bytes: 1500000\.0 is not a size"):
        experiment_from_dict(data)


