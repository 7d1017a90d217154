"""The software stack's attention kernel: PyTorch's scaled_dot_product_attention where the
model's stack is torch's own (`[model] kernels = "eager" | "compiled"`), which on Hopper runs
FlashAttention-2, not the cuDNN / FlashAttention-3 class kernel the fused stack (Megatron-Core
with Transformer Engine) and the default profiles' `flash_attn` efficiency stand for.

PyTorch's SDPA picks its FLASH_ATTENTION backend (FlashAttention-2) on Hopper: cuDNN's attention
became opt-in again after PyTorch 2.5 (pytorch/pytorch#138522), and torchtitan lists only
FLASH_ATTENTION, EFFICIENT_ATTENTION and MATH below Blackwell (pytorch/torchtitan#1196,
torchtitan/models/attention.py). Measured on one H100 by tritonbench's flash_attention with
PyTorch nightly 2.6.0.dev20241204 (torchtitan's published tables ran torch 1963fc8 of
2024-12-23: docs/performance.md @eaea6f6), batch 1, 24 heads, sequence 4,608, head 128: sdpa
329.483 TFLOP/s against cudnn_90100 631.338 (pytorch/pytorch#142132). The forward's ratio
stands for the backward too: no public backward pair of one run.
"""

from __future__ import annotations

from dataclasses import replace

from sim.profile import Profile
from topology.cluster import Accelerator
from traces.kernel_names import Kernel

SDPA_FLASH_OF_FUSED: dict[str, float] = {
    name: 329.483 / 631.338 for name in ("H100-SXM5-80GB", "H100-SXM5-96GB", "H200-SXM-141GB")}
"""Per accelerator, SDPA's flash attention rate over the fused stack's where they differ
(Hopper: FlashAttention-2 over cuDNN). Elsewhere the same kernel class: on the A100 the
default is FlashAttention-2's own figure; on Blackwell torchtitan asks for cuDNN (#1196)."""


def stack_profile(profile: Profile, accelerator: Accelerator, kernels: str) -> Profile:
    """The default `profile` as the model's software stack runs attention: for torch's stacks
    on Hopper, `flash_attn` at SDPA's share of the fused kernel's efficiency. A profile from a
    file is measured and used as it is (the caller passes only default profiles)."""
    ratio = SDPA_FLASH_OF_FUSED.get(accelerator.name, 1.0)
    name = str(Kernel.FLASH_ATTN)
    fused = profile.kernel(name).flops_efficiency
    if kernels == "fused" or ratio == 1.0 or fused is None:
        return profile
    cost = replace(profile.kernel(name), flops_efficiency=fused * ratio)
    compute = replace(profile.compute, kernels={**profile.compute.kernels, name: cost})
    return replace(profile, name=f"{profile.name}-sdpa", compute=compute)

