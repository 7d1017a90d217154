"""One kernel's cost for one micro-batch (`KernelWork`) and the two shapes every kernel takes:
a GEMM (FLOPs by shape, operands read and product written once) or a memory-bound kernel.

    from traces.kernel_work import gemm_kernel
    gemm_kernel(Kernel.QKV, (1, 2048, 3 * 4096, 4096), e=2, grad_bytes=2)

`traces.kernels` lists a layer's kernels with these; `traces.fp8` the FP8 variants.
"""

from __future__ import annotations

from dataclasses import dataclass

from traces.purpose import Kernel

Gemm = tuple[int, int, int, int]
"""(batch, M, N, K): batch products of an M×K and a K×N matrix."""


@dataclass(frozen=True, slots=True)
class KernelWork:
    """One kernel's cost for one micro-batch: forward, and its own backward. A kernel with
    neither FLOPs nor bytes in a phase runs no op in it (an FP8 cast runs in one phase)."""

    name: Kernel
    flops: float
    mem_bytes: float
    bwd_flops: float
    bwd_bytes: float
    gemm: Gemm | None = None
    fp8: bool = False
    """A GEMM on FP8 operands, at the accelerator's FP8 rate (or on FP4 ones, with `fp4`)."""
    fp4: bool = False
    """With `fp8`: the operands are NVFP4, the GEMM at the accelerator's FP4 rate."""
    draws: float = 0.0
    """Random numbers the forward draws (dropout's mask, `traces.kernels`; a recomputed
    forward draws them again), timed on the integer lanes (`sim.models.compute`)."""
    bwd_draws: float = 0.0
    """Random numbers the backward draws (flash attention regenerates its dropout mask)."""
    launches: tuple[int, int] | None = None
    """(forward, backward) device kernels a software stack launches for it (`traces.stack`);
    None: the fused stack's one each (a GEMM's backward two). A stated count keeps the op in
    both phases even where the stack launches nothing (autograd's add passes gradients on)."""


def gemm_kernel(name: Kernel, gemm: Gemm, e: int, grad_bytes: int, weights: bool = True
                ) -> KernelWork:
    """A GEMM and its backward. Forward reads A (M×K) and B (K×N), writes C (M×N). Backward
    computes dA = dC·Bᵀ (reads dC, B, writes dA) and dB = Aᵀ·dC (reads A, dC, writes dB); a
    weight gradient (`weights`) is accumulated in `grad_bytes` per element (read and written)."""
    batch, m, n, k = gemm
    flops = 2.0 * batch * m * n * k
    a, b, c = batch * m * k, batch * k * n, batch * m * n
    forward = (a + b + c) * e
    db = 2 * b * grad_bytes if weights else b * e
    backward = (c + b + a) * e + (a + c) * e + db
    return KernelWork(name, flops, forward, 2 * flops, backward, gemm)


def memory_kernel(name: Kernel, fwd_bytes: float, bwd_bytes: float, draws: float = 0.0
                  ) -> KernelWork:
    """A memory-bound kernel: its bytes each way, and the random numbers its forward draws."""
    return KernelWork(name, 0.0, fwd_bytes, 0.0, bwd_bytes, draws=draws)
