"""FSDP2 and the distributed optimizer as frameworks run them: `reshard_after_forward` and
`grad_sync`, two `[parallel]` keys, their rules, and the one statement of when a ZeRO-3 unit
is freed and when gradients are reduced (the plan builder and the executor both read it).

reshard_after_forward (ZeRO 3 only; PyTorch FSDP2's `fully_shard(reshard_after_forward=...)`)
    true    (default) a unit's parameters are all-gathered before each forward and each
            backward and freed after each: ZeRO-3 as parasim always ran it (DeepSpeed ZeRO-3,
            FSDP1's FULL_SHARD). parasim's embedding and output-layer units are gathered like
            layers; FSDP2's root module (None: not resharded after forward) and torchtitan's
            last block (not resharded, being prefetched at once) are not special-cased, so
            that plans and predictions from before the key keep their numbers.
    false   the parameters gathered for the forward stay gathered for the backward (no
            backward gather). After the backward FSDP2 reshards (`reshard_after_backward`
            True), but with a pipeline, torchtitan's setting (its "default" policy chooses
            false when PP is on, "to avoid per-microbatch all-gathers"), PyTorch's
            `PipelineStage` (torch/distributed/pipelining/stage.py, backward_maybe_with_nosync)
            calls `set_reshard_after_backward(False)` on every backward and reshards only in
            the post-backward of the last one. So:
              pp = 1   a unit is freed after each backward (one gather per micro-batch)
              pp > 1   a unit is kept from its first forward to its last backward of the step
                       (one gather per step)
            A unit is gathered before a pass whenever it is not gathered then (FSDP2's
            unshard is a no-op on an unsharded unit), so GPipe at pp = 1 re-gathers in the
            backwards after the first.

grad_sync (the default is the ZeRO stage's own, so every earlier output stays the same)
    "microbatch"  gradients reduced in every micro-batch's backward: ZeRO 2 bucket by bucket
                  (DeepSpeed ZeRO-2), ZeRO 3 unit by unit (FSDP without no_sync); the default
                  at ZeRO 2 and 3. Refused at ZeRO 0 and 1, which keep full gradients and
                  reduce once per step (DDP's no_sync; parasim does not model reducing an
                  accumulated full buffer again each micro-batch).
    "step"        gradients accumulated locally, reduced once in the last micro-batch's
                  backward: the default at ZeRO 0 and 1; at ZeRO 2 Megatron-Core's
                  distributed optimizer (a full gradient buffer, one reduce-scatter per bucket
                  per step); at ZeRO 3 FSDP2 with `set_requires_gradient_sync(False)` on all
                  but the last micro-batch (unsharded gradients accumulated, one reduce-scatter
                  per unit per step; what `PipelineStage` does under PP). The memory model
                  holds full gradients then (`sim.models.memory`); the plan runs FSDP2's
                  accumulation kernel per unit and backward, and under PP issues the
                  reductions after the stage's last backward (`traces.fsdp_kernels`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from traces.errors import ConfigError, show
from traces.fields import check_bool, check_choice


class GradSync(StrEnum):
    """When gradients are reduced over the data-parallel group."""

    MICROBATCH = "microbatch"
    """In every micro-batch's backward."""
    STEP = "step"
    """Once per step, in the last micro-batch's backward."""


class Sharding(Protocol):
    """What the rules below read of a `traces.layout.Layout` (which imports this module)."""

    @property
    def reshard_after_forward(self) -> bool: ...
    @property
    def pp(self) -> int: ...
    @property
    def sync(self) -> GradSync: ...
    @property
    def num_microbatches(self) -> int: ...


def default_grad_sync(zero: int) -> GradSync:
    """The stage's own: ZeRO 2 and 3 reduce every micro-batch, ZeRO 0 and 1 once a step."""
    return GradSync.MICROBATCH if zero >= 2 else GradSync.STEP


def checked_grad_sync(value: object, zero: int) -> GradSync | None:
    """`parallel.grad_sync` as `Layout` stores it: None for the stage's own (given or
    omitted), so a layout that states its default reads as one that leaves it out."""
    if value is None:
        return None
    plain = str(value) if isinstance(value, GradSync) else value
    sync = GradSync(check_choice(plain, "parallel.grad_sync", [str(g) for g in GradSync]))
    if sync is GradSync.MICROBATCH and zero < 2:
        raise ConfigError(f"parallel.grad_sync: \"microbatch\" needs zero = 2 or 3, not "
                          f"{show(zero)} (ZeRO 0 and 1 keep full gradients and reduce them "
                          "once per step)")
    return None if sync is default_grad_sync(zero) else sync


def check_reshard(value: object, zero: int) -> None:
    """`parallel.reshard_after_forward`: a bool; false only where ZeRO-3 gathers parameters."""
    check_bool(value, "parallel.reshard_after_forward")
    if value is False and zero != 3:
        raise ConfigError(f"parallel.reshard_after_forward: false needs zero = 3 (FSDP), not "
                          f"{show(zero)} (only ZeRO-3 gathers and frees parameters)")


def syncs_grads(layout: Sharding, microbatch: int) -> bool:
    """Whether gradients are reduced in `microbatch`'s backward (`grad_sync`)."""
    return layout.sync is GradSync.MICROBATCH or microbatch == layout.num_microbatches - 1


def keeps_across_microbatches(layout: Sharding) -> bool:
    """ZeRO-3 units stay gathered from their first forward to their last backward of the
    step: reshard_after_forward false under a pipeline (PipelineStage's no reshard after
    backward)."""
    return not layout.reshard_after_forward and layout.pp > 1


def frees_after(layout: Sharding, forward: bool, microbatch: int) -> bool:
    """Whether a ZeRO-3 unit's gathered parameters are freed after its forward (`forward`)
    or backward pass of `microbatch` (the module docstring's rule)."""
    if forward:
        return layout.reshard_after_forward
    return not keeps_across_microbatches(layout) or \
        microbatch == layout.num_microbatches - 1
