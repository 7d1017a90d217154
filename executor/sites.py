"""Which tensor a plan's `tp` collective acts on, from where it sits between two kernels.

Megatron-LM's f and g operators (docs/plan-ops.md, `tp` row). In forward (and recompute):

    after proj, fc2, embed       their output: all_reduce (partial sums); SP reduce_scatter
    before qkv, fc1, logits      their input, SP only: all_gather the sequence shards (the
                                 shard is kept for backward, the gathered input is not)

In backward:

    after qkv, fc1, logits       the gradient of their input: all_reduce; SP reduce_scatter
    before qkv, fc1, logits      their input again, SP only: all_gather the shard the forward
                                 kept (Megatron-LM's sequence-parallel linear re-gathers it
                                 for the weight gradient)
    before proj, fc2             the gradient of their output, SP only: all_gather
    after pos_embed              the gradient of its input, SP only: all_gather

Anything else is not a place for a `tp` op, and the plan is rejected before it runs. (The
all-gather of a pipeline message received without SP is placed by its receive, not by its
kernels: `executor.program`.)
"""

from __future__ import annotations

from dataclasses import dataclass

from traces.ops import OpKind, Phase

_FWD_AFTER = {"proj": "attn", "fc2": "mlp", "embed": "emb"}
_FWD_BEFORE = {"qkv": "a1", "fc1": "a2", "logits": "fln"}
_BWD_AFTER = {"qkv": "a1", "fc1": "a2", "logits": "fln"}
_BWD_REGATHER = _FWD_BEFORE
_BWD_BEFORE = {"proj": "attn", "fc2": "mlp"}
_BWD_AFTER_SP = {"pos_embed": "emb"}


@dataclass(frozen=True, slots=True)
class TpSite:
    kernel: str
    """The kernel whose slot it is (its scope and layer place the slot)."""
    slot: str
    grad: bool
    """The slot's gradient (backward) rather than its value."""
    kind: OpKind
    saved: bool = False
    """An all-gather of the sequence shard the kernel's forward kept, for its backward."""


def tp_site(phase: Phase, prev: str | None, following: str | None, sp: bool) -> TpSite | None:
    """The site of a `tp` op after compute op `prev` and before `following` (their names, in
    the same phase), or None when no rule fits."""
    split = OpKind.REDUCE_SCATTER if sp else OpKind.ALL_REDUCE
    if phase in (Phase.FWD, Phase.RECOMPUTE):
        if prev in _FWD_AFTER:
            return TpSite(prev, _FWD_AFTER[prev], False, split)
        if sp and following in _FWD_BEFORE:
            return TpSite(following, _FWD_BEFORE[following], False, OpKind.ALL_GATHER)
        return None
    if phase is Phase.BWD:
        if prev in _BWD_AFTER:
            return TpSite(prev, _BWD_AFTER[prev], True, split)
        if sp and prev in _BWD_AFTER_SP:
            return TpSite(prev, _BWD_AFTER_SP[prev], True, OpKind.ALL_GATHER)
        if sp and following in _BWD_REGATHER:
            return TpSite(following, _BWD_REGATHER[following], False, OpKind.ALL_GATHER,
                          saved=True)
        if sp and following in _BWD_BEFORE:
            return TpSite(following, _BWD_BEFORE[following], True, OpKind.ALL_GATHER)
    return None
