"""What FSDP2 runs around its gradients when they are not reduced every micro-batch
(`grad_sync = "step"` at ZeRO 3, `traces.fsdp`): the accumulation kernel of each unit's
unsharded gradients and, under a pipeline, when the step's reduce-scatters start.

Accumulation. In a backward without gradient sync FSDP2's post-backward keeps each parameter's
unsharded gradient (torch/distributed/fsdp/_fully_shard/_fsdp_param.py,
`to_accumulated_grad_if_needed` and `accumulate_unsharded_grad_if_needed`, called from
`FSDPParamGroup.post_backward`; the gradient accumulation without reduction of
pytorch/pytorch#118298). With a reduce dtype wider than the parameters' (torchtitan's
`mixed_precision_reduce = "float32"` under bf16 parameters) the first such backward casts the
gradient to the reduce dtype (`unsharded_grad.to(reduce_dtype)`: reads the parameter-dtype
gradient, writes the reduce-dtype copy), and every later backward adds the new gradient into
it (`unsharded_accumulated_grad += grad`: reads both, writes the sum). With one dtype autograd
accumulates into `.grad` itself from the second backward on (the same read, read, write). So,
per parameter, with p the parameter dtype's bytes and g the reduce dtype's:

    the unit's first backward of the step   p + g   (0 where g == p: autograd keeps the grad)
    every later backward                    2·g + p

one memory-bound kernel after the unit's backward, on the compute stream. The backward of the
last micro-batch accumulates too: its gradients are then reduced from the sum. Megatron-Core's
distributed optimizer (ZeRO 2 with `grad_sync = "step"`) accumulates inside the weight-gradient
GEMM (gradient_accumulation_fusion) and launches no such kernel, so only ZeRO 3 has it.

Reduce-scatters under a pipeline. PyTorch's `PipelineStage` (torch/distributed/pipelining/
stage.py, `backward_maybe_with_nosync`, as of torch 2.6: the version torchtitan's published
tables ran, docs/performance.md @eaea6f6) turns FSDP2's gradient sync and resharding off for
every backward and, after the stage's last backward has finished, calls `post_backward` on every
FSDP unit of the stage (`run_post_backward`): the stage's reduce-scatters are issued together
once its whole last backward is over, not unit by unit as the backward completes each.
"""

from __future__ import annotations

from traces.fsdp import GradSync, Sharding


def accumulates(layout: Sharding, zero: int) -> bool:
    """Whether ZeRO-3 units accumulate unsharded gradients across micro-batches (FSDP2
    without gradient sync before the last)."""
    return zero == 3 and layout.sync is GradSync.STEP and layout.num_microbatches > 1


def accumulate_bytes(params: float, param_bytes: int, reduce_bytes: int,
                     first: bool) -> float:
    """HBM bytes of one unit's accumulation kernel in one backward (module docstring)."""
    if first:
        return params * (param_bytes + reduce_bytes) if reduce_bytes != param_bytes else 0.0
    return params * (2 * reduce_bytes + param_bytes)


def reduces_after_stage(layout: Sharding, zero: int) -> bool:
    """Whether the step's reduce-scatters wait for the stage's whole last backward
    (`PipelineStage` with FSDP2: a pipeline with gradients reduced once per step)."""
    return zero == 3 and layout.sync is GradSync.STEP and layout.pp > 1
