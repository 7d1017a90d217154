"""Megatron-LM's count of a kernel's FLOPs, from the FLOPs parasim's flash kernel executes.

Megatron-LM counts the attention core's full s² (forward 4·b·s²·q/t, backward twice that);
a causal flash kernel executes half of the forward and 2.5 times that in backward
(`traces.kernels.FLASH_CAUSAL`, `FLASH_BWD`). Every other kernel is counted alike.
"""

from __future__ import annotations

from traces.kernel_names import Kernel
from traces.kernel_work import KernelWork
from traces.kernels import FLASH_BWD, FLASH_CAUSAL
from traces.ops import Op, Phase
from traces.purpose import KernelRun


def megatron_fwd(k: KernelWork) -> float:
    """A kernel's forward FLOPs as Megatron-LM counts them."""
    return k.flops / FLASH_CAUSAL if k.name is Kernel.FLASH_ATTN else k.flops


def megatron_op(op: Op) -> float:
    """A plan op's FLOPs as Megatron-LM counts them (flash's backward: twice its full square)."""
    if op.purpose != KernelRun(Kernel.FLASH_ATTN):
        return op.flops
    if op.phase is Phase.BWD:
        return 2 * op.flops / (FLASH_BWD * FLASH_CAUSAL)
    return op.flops / FLASH_CAUSAL
