"""The optimizer step as `torch.optim.AdamW(foreach=True)` runs it: `[parallel] optimizer =
"foreach"`, torchtitan's default (its `build_optimizers` passes `fused = job_config.optimizer.
fused`, a store_true flag off by default, and `foreach = not fused`: pytorch/torchtitan
torchtitan/optimizer.py and config_manager.py as of the published tables).

parasim's default (`optimizer = "fused"`) is Megatron-LM's step (`traces.kernels.
step_kernel_bytes`): one fused Adam kernel over fp32 main parameters, then their copy into the
16-bit model parameters and the gradient buffer's zeroing. torch.optim's AdamW instead updates
the parameters it is given in place, one `_foreach_*` kernel per arithmetic step
(torch/optim/adamw.py `_multi_tensor_adamw`, pytorch/pytorch 002d2f0, capturable = False: the
bias corrections are host scalars); each kernel reads and writes whole tensors through HBM. Per
parameter, with fp32 parameters and moments (FSDP2's sharded parameters are the fp32 master
weights: its mixed precision casts them to bf16 only when gathering) and g-byte gradients:

    _foreach_mul_(params, 1 - lr·wd)                     read 4, write 4          8
    _foreach_lerp_(exp_avgs, grads, 1 - beta1)           read 4 + g, write 4      8 + g
    _foreach_mul_(exp_avg_sqs, beta2)                    read 4, write 4          8
    _foreach_addcmul_(exp_avg_sqs, grads, grads, ...)    read 4 + g, write 4      8 + g
    exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)         read 4, write 4          8
    _foreach_div_(exp_avg_sq_sqrt, bias_correction2)     read 4, write 4          8
    _foreach_add_(exp_avg_sq_sqrt, eps)                  read 4, write 4          8
    _foreach_addcdiv_(params, exp_avgs, sqrt, step)      read 12, write 4         16

72 + 2g bytes (80 with fp32 gradients, FSDP2's under `mixed_precision_reduce = "float32"`),
against the fused step's 28 + 6 + g. No copy to 16 bits (the parameters are the ones FSDP2
gathers) and no zeroing (`zero_grad()` sets gradients to None). The clip before it is torch's
`clip_grad_norm_(foreach=True)`: `_foreach_norm` reads the gradients (g), `_foreach_mul_` scales
them (2g), as parasim's step already counts for fp32 gradients. The `_foreach_add_` of the step
counters runs on host tensors (capturable = False) and moves no HBM bytes.
"""

from __future__ import annotations

from traces.errors import ConfigError, show
from traces.kernel_names import Kernel

OPTIMIZERS = ("fused", "foreach")
"""`[parallel] optimizer`: Megatron-LM's fused Adam step (default) or torch.optim's foreach
AdamW (module docstring)."""
MOMENT_BYTES = 4
"""torch.optim keeps exp_avg and exp_avg_sq in the parameters' dtype: fp32 under FSDP2."""


def foreach_adamw_bytes(grad_bytes: int) -> float:
    """HBM bytes per parameter of `_multi_tensor_adamw`'s eight kernels (module docstring)."""
    param = MOMENT_BYTES
    return float(2 * param + (2 * param + grad_bytes) + 2 * param + (2 * param + grad_bytes)
                 + 3 * (2 * param) + (4 * param))


def foreach_step_kernel_bytes(grad_bytes: int) -> tuple[tuple[Kernel, float], ...]:
    """The end of a torch.optim step, per parameter: the norm, the clip, the AdamW update."""
    return ((Kernel.GRAD_NORM, float(grad_bytes)), (Kernel.GRAD_CLIP, 2.0 * grad_bytes),
            (Kernel.OPTIMIZER, foreach_adamw_bytes(grad_bytes)))


def check_optimizer(optimizer: object, moments: tuple[str, str]) -> None:
    """`parallel.optimizer` is one of OPTIMIZERS; torch.optim keeps its moments in the
    parameters' fp32, so "foreach" takes no narrower exp_avg / exp_avg_sq dtype."""
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise ConfigError(f"parallel.optimizer: {show(optimizer)} is not one of "
                          f"{', '.join(OPTIMIZERS)}")
    if optimizer == "foreach" and moments != ("fp32", "fp32"):
        raise ConfigError("parallel.optimizer: \"foreach\" (torch.optim's AdamW) keeps "
                          "exp_avg and exp_avg_sq in fp32; exp_avg_dtype / exp_avg_sq_dtype "
                          "are Megatron-Core's options")
