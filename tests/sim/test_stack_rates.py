"""PyTorch SDPA's flash attention under torch's own stacks (`sim.models.stack_rates`): on
Hopper FlashAttention-2 at the rate pytorch/pytorch#142132 measured against cuDNN's."""

from __future__ import annotations

import pytest

from sim.config import experiment_from_dict
from sim.models import rates
from sim.models.compute import ComputeModel
from sim.models.stack_rates import SDPA_FLASH_OF_FUSED

FLASH = "flash_attn"


def config(preset: str, kernels: str) -> dict:
    """A one-node Llama-style job with flash attention on `preset` under the `kernels` stack."""
    return {"model": {"layers": 2, "hidden": 1024, "heads": 8, "seq_len": 4096, "vocab": 1024,
                      "ffn": "swiglu", "ffn_hidden": 2816, "norm": "rmsnorm",
                      "position": "rope", "bias": False,
                      "attention": "flash", "kernels": kernels},
            "parallel": {"dp": 8, "global_batch": 8},
            "cluster": {"preset": preset, "nodes": 1}}


def test_the_ratio_is_the_published_pair():
    """sdpa 329.483 TFLOP/s against cudnn_90100 631.338 on one H100 (#142132)."""
    assert SDPA_FLASH_OF_FUSED["H100-SXM5-80GB"] == pytest.approx(0.52188, abs=5e-6)


@pytest.mark.parametrize("kernels", ["eager", "compiled"])
def test_torch_stacks_on_hopper_run_flash_at_sdpas_rate(kernels):
    """On an H100 the eager and compiled stacks' flash efficiency is the fused default times
    329.483 / 631.338; every other kernel keeps the fused stack's figures."""
    fused = experiment_from_dict(config("dgx-h100", "fused")).profile
    torch = experiment_from_dict(config("dgx-h100", kernels)).profile
    assert fused.kernel(FLASH).flops_efficiency == rates.H100.flash_attn
    assert torch.kernel(FLASH).flops_efficiency == pytest.approx(
        rates.H100.flash_attn * 329.483 / 631.338, rel=1e-12)
    assert torch.compute.gemm_efficiency == fused.compute.gemm_efficiency
    assert {k: v for k, v in torch.compute.kernels.items() if k != FLASH} == \
        {k: v for k, v in fused.compute.kernels.items() if k != FLASH}


def test_a_compute_bound_flash_kernel_takes_the_inverse_ratio_longer():
    """A flash op with FLOPs and no bytes is compute-bound: its time under SDPA over its time
    under the fused stack, each less its one launch, is 631.338 / 329.483 exactly."""
    times = []
    for kernels in ("fused", "eager"):
        exp = experiment_from_dict(config("dgx-h100", kernels))
        model = ComputeModel(exp.cluster.accelerator, exp.profile)
        launch = exp.profile.compute.launch_overhead_s
        times.append(model.kernel_time(FLASH, 1e15, 0.0) - launch)
    assert times[1] / times[0] == pytest.approx(631.338 / 329.483, rel=1e-9)


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-b200"])
def test_elsewhere_sdpa_runs_the_fused_class_kernel(preset):
    """On the A100 the default is FlashAttention-2's own figure and on Blackwell torchtitan
    asks for cuDNN: the eager stack's profile is the fused one."""
    fused = experiment_from_dict(config(preset, "fused")).profile
    assert experiment_from_dict(config(preset, "eager")).profile == fused
