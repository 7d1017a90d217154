"""The compute model charges a software stack's launches (`traces.stack.launch_counts`): one
launch overhead per device kernel the stack states for an op, none for an op fused into
another's kernel; without a stack, an op's own one (a GEMM's backward two)."""

from __future__ import annotations

import dataclasses

import pytest

from sim.models.compute import ComputeModel
from sim.profile import default_profile
from topology.presets import H100_SXM
from traces.model import ModelSpec
from traces.stack import launch_counts

LLAMA = ModelSpec(layers=2, hidden=4096, heads=32, kv_heads=8, seq_len=2048, vocab=128256,
                  ffn="swiglu", ffn_hidden=14336, norm="rmsnorm", position="rope", bias=False,
                  dropout=0.0)


@pytest.mark.parametrize(("stack", "kernel", "backward", "launches"), [
    ("eager", "ln1", False, 6), ("eager", "ln1", True, 17), ("eager", "rope", False, 6),
    ("eager", "bda1", True, 0), ("compiled", "ln2", False, 0), ("compiled", "ln2", True, 1),
    ("eager", "qkv", True, 2),
])
def test_a_stacks_launches_each_cost_one_overhead(stack, kernel, backward, launches):
    profile = default_profile(H100_SXM)
    plain = ComputeModel(H100_SXM, profile)
    stacked = ComputeModel(H100_SXM, profile,
                           launch_counts(dataclasses.replace(LLAMA, kernels=stack)))
    gemm = (1, 2048, 6144, 4096) if kernel == "qkv" else ()
    own = 2 if gemm and backward else 1
    args = (kernel, 1e9 if gemm else 0.0, 3e7, gemm)
    extra = stacked.kernel_time(*args, backward=backward) - plain.kernel_time(
        *args, backward=backward)
    assert extra == pytest.approx((launches - own) * profile.compute.launch_overhead_s,
                                  abs=1e-15)


def test_without_a_stated_stack_nothing_changes():
    assert launch_counts(LLAMA) is None
    profile = default_profile(H100_SXM)
    assert ComputeModel(H100_SXM, profile, None).kernel_time("ln1", 0.0, 3e7) == \
        ComputeModel(H100_SXM, profile).kernel_time("ln1", 0.0, 3e7)
