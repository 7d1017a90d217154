"""What FSDP2 runs around its gathers and gradients beyond the collectives: the copy-out after
every gather, the copy-in before every reduce-scatter, and where gradients are not reduced
every micro-batch (`grad_sync = "step"` at ZeRO 3, `traces.fsdp`) the accumulation kernel of
each unit's unsharded gradients and, under a pipeline, when the step's reduce-scatters start.

Copy-out. FSDP2 all-gathers a unit's shards into one flat buffer and, before the unit's first
op, copies each parameter's slices out of it into that parameter's own unsharded tensor
(torch/distributed/_composable/fsdp/_fsdp_collectives.py, `foreach_all_gather_copy_out`:
`split_with_sizes_copy(all_gather_output, ..., out=...)`, called by
`FSDPParamGroup.wait_for_unshard` on the current, compute, stream; pytorch/pytorch 415cc26,
torch 2.5-2.6): a memory-bound kernel reading the gathered bytes and writing them again, once
per gather. It is PyTorch's FSDP2 (`fully_shard`, torchtitan's), so parasim runs it where the
software stack is PyTorch's (`[model] kernels = "eager" | "compiled"`, `traces.stack`) at
ZeRO 3; Megatron-Core and DeepSpeed's ZeRO-3 gather into the buffer the parameters view, and
their jobs (kernels = "fused") keep their numbers.

Reduce-scatter copy-in. Before each reduce-scatter FSDP2 copies the unit's unsharded gradients
into one flat reduce-scatter input of the reduce dtype, rank by rank (torch 2.5-2.6
`_fsdp_collectives.foreach_reduce` and `foreach_reduce_scatter_copy_in`:
`torch._chunk_cat(unsharded_grads, dim=0, num_chunks=world_size, out=reduce_scatter_input)`,
pytorch/pytorch 415cc26; `reduce_scatter_input` is allocated with `dtype=reduce_dtype`, so under
torchtitan's `mixed_precision_reduce = "float32"` the bf16 gradients are cast to fp32 in the
same kernel). The kernel reads each gradient element in its own dtype and writes it in the
reduce dtype: per parameter p + g bytes (p the parameter dtype's, g the reduce dtype's), or
g + g where the unit's gradients were accumulated in the reduce dtype across micro-batches
(below). The compute stream waits for it before going on (`current_stream.wait_stream(
reduce_scatter_stream)` right after the copy-in, "Only after the copy-in finishes can we free
the gradients"; later versions run the copy-in on the current stream itself), so parasim runs
it on the compute stream after the unit's backward and the reduce-scatter waits for it. Not
modelled: in 415cc26 the copy-in is queued on the reduce-scatter stream behind the previous
unit's reduce-scatter, so the compute stream also waits for that one (a few ms at most against
a layer's backward in the torchtitan rows).

Megatron-FSDP's gradient copy. Megatron-FSDP (Megatron-Core's ZeRO 3, kernels = "fused")
has the weight-gradient GEMM accumulate into its gradient bucket while gradient_accumulation_fusion
is on (Megatron-Core's default). Off, Transformer Engine returns each weight's gradient as
`param.grad` and Megatron-FSDP's post-backward hook copies it into the unit's unsharded
main-gradient bucket, the input its reduce-scatter reads (NVIDIA/Megatron-LM
megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py @00caa53, `_grad_acc`:
`param.main_grad.copy_(to_local_if_dtensor(param.grad))` for a sharded gradient buffer, from
`_process_post_backward_gradients` before `grad_reduce_pipeline.reduce_gradients`; it runs in
the backward hook, on the compute stream). The same bytes as FSDP2's copy-in: per parameter
its gradient read in the parameter dtype, written in the reduce dtype. Megatron-Bridge's
performance scripts turn the fusion off wherever they use Megatron-FSDP
(`cfg.model.gradient_accumulation_fusion = False  # Disabled to avoid functional errors`:
NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/llama/llama3_llm_pretrain.py,
llama3_70b_gb200_config, llama3_70b_gb300_config, llama3_8b_h100_config).

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


def copies_out(zero: int, kernels: str) -> bool:
    """Whether each ZeRO-3 gather is followed by FSDP2's copy-out (PyTorch's stack)."""
    return zero == 3 and kernels != "fused"


def copies_in(zero: int, kernels: str, fused_accumulation: bool) -> bool:
    """Whether each ZeRO-3 reduce-scatter waits for a copy of the unit's gradients into its
    input: FSDP2's copy-in (PyTorch's stack), or Megatron-FSDP's `main_grad.copy_` without
    gradient_accumulation_fusion (module docstring)."""
    return copies_out(zero, kernels) or (zero == 3 and not fused_accumulation)


def copy_out_bytes(gathered: float) -> float:
    """HBM bytes of FSDP2's copy-out of `gathered` all-gathered bytes: read once, written
    once into the parameters' unsharded tensors."""
    return 2 * gathered


def rs_copy_in_bytes(params: float, grad_bytes: int, reduce_bytes: int) -> float:
    """HBM bytes of FSDP2's reduce-scatter copy-in of `params` gradients held in `grad_bytes`
    per element into a `reduce_bytes` reduce-scatter input (module docstring)."""
    return params * (grad_bytes + reduce_bytes)


def reduces_after_stage(layout: Sharding, zero: int) -> bool:
    """Whether the step's reduce-scatters wait for the stage's whole last backward
    (`PipelineStage` with FSDP2: a pipeline with gradients reduced once per step)."""
    return zero == 3 and layout.sync is GradSync.STEP and layout.pp > 1
