"""Recomputation's price in the simulated step: selective re-runs exactly the attention core's
forward kernels (the four unfused ops, or the flash forward), full the whole layer's forward."""

import pytest

from sim.config import experiment_from_dict
from sim.models.compute import ComputeModel
from sim.simulate import predict
from traces.kernels import ATTENTION_CORE, layer_kernels

LAYERS, MICROBATCHES = 4, 4


def _compute_s(attention: str, recompute: str) -> float:
    exp = experiment_from_dict({
        "model": {"layers": LAYERS, "hidden": 1024, "heads": 16, "seq_len": 1024,
                  "vocab": 1024, "attention": attention},
        "parallel": {"global_batch": MICROBATCHES, "recompute": recompute},
        "cluster": {"preset": "dgx-a100", "nodes": 1, "gpus_per_node": 1},
    })
    return predict(exp)[0].compute_s


def _forward_s(attention: str, names: set[str] | None) -> float:
    """One micro-batch's forward of one layer, summed over the kernels named (all if None),
    timed by the compute model alone: an independent path from the plan's replay."""
    exp = experiment_from_dict({
        "model": {"layers": LAYERS, "hidden": 1024, "heads": 16, "seq_len": 1024,
                  "vocab": 1024, "attention": attention},
        "parallel": {"global_batch": MICROBATCHES},
        "cluster": {"preset": "dgx-a100", "nodes": 1, "gpus_per_node": 1},
    })
    model = ComputeModel(exp.cluster.accelerator, exp.profile)
    return sum(model.kernel_time(k.name, k.flops, k.mem_bytes, k.gemm or (), draws=k.draws)
               for k in layer_kernels(exp.model, 1, 1, False)
               if names is None or k.name in names)


@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_selective_adds_the_attention_cores_forward_and_full_the_layers(attention):
    none = _compute_s(attention, "none")
    core = _forward_s(attention, set(ATTENTION_CORE[attention]))
    layer = _forward_s(attention, None)
    assert len(ATTENTION_CORE[attention]) == (1 if attention == "flash" else 4)
    runs = LAYERS * MICROBATCHES
    assert _compute_s(attention, "selective") - none == pytest.approx(runs * core, rel=1e-9)
    assert _compute_s(attention, "full") - none == pytest.approx(runs * layer, rel=1e-9)
    assert 0 < core < layer
