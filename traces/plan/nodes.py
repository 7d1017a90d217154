"""The plan builder's working form: ops under construction with symbolic dependencies.

A rank's plan under construction is a `Program`: one list of `Node`s per schedule action, in
schedule order, and a last list for the end of the step (the optimizer). Every pass takes a
program and returns a new one with its own ops inserted. A node wraps the `Op` it will become,
says which unit of parameters it belongs to (`traces.purpose.Unit`), and lists
the nodes it must wait for (`after`). Positions are only fixed at the end: `finalize` numbers
the nodes in order and turns `after` into the op's `deps` indices. So a pass inserts an op
anywhere without renumbering anything, and refers to other ops by the nodes themselves.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain, compress, count, repeat
from operator import attrgetter

from traces import mla
from traces.layout import Axis, Layout, Schedule
from traces.model import ModelSpec
from traces.moe_spec import expert_params as moe_expert_params
from traces.moe_spec import is_moe_layer
from traces.mtp import mtp_unit_extra
from traces.ops import Op, Stream
from traces.plan.budget import OpBudget
from traces.purpose import Part, Unit
from traces.schedule_rules import dualpipe_rank


class Node:
    """One op of a plan being built (a plain slotted class: a 1024-GPU plan makes ~10^6)."""

    __slots__ = ("op", "unit", "after", "on_compute", "index")

    def __init__(self, op: Op, unit: Unit | None = None,
                 after: list[Node] | tuple[()] | None = None) -> None:
        self.op = op
        self.unit = unit
        self.after: list[Node] | tuple[()] = () if after is None else after
        """What it waits for: a list, or () for nothing yet (most nodes: no list each; add
        with `wait_for` and `wait_first`)."""
        self.on_compute = op.stream == _COMPUTE
        self.index = -1
        """Position in the finished op list (set by `finalize`)."""

    def wait_for(self, node: Node) -> None:
        """Wait for `node` too, after what it waits for already."""
        if type(self.after) is tuple:
            self.after = [node]
        else:
            self.after.append(node)  # type: ignore[union-attr]

    def wait_first(self, nodes: list[Node]) -> None:
        """Wait for `nodes` too, before what it waits for already."""
        if type(self.after) is tuple:
            self.after = list(nodes)
        else:
            self.after[:0] = nodes  # type: ignore[index]


_COMPUTE = Stream.COMPUTE

Program = list[list[Node]]
"""A rank's nodes: one list per schedule action, then one for the end of the step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankContext:
    """What every pass needs to know about the rank it lowers."""

    model: ModelSpec
    layout: Layout
    rank: int
    budget: OpBudget | None = None
    """Where the passes account for the ops they add (None: no limit)."""

    @property
    def local_model(self) -> ModelSpec:
        """The model as one CP rank's kernels see it: seq_len / cp tokens (two of the 2·cp
        chunks, `traces.plan.context`); the model itself when cp = 1."""
        if self.layout.cp == 1:
            return self.model
        return dataclasses.replace(self.model, seq_len=self.model.seq_len // self.layout.cp)

    @property
    def pp_rank(self) -> int:
        return self.layout.coords(self.rank).pp

    @property
    def last_stage(self) -> int:
        """The last virtual stage of the whole pipeline."""
        return self.layout.num_stages - 1

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element: fp32 main gradients, or the model's dtype."""
        return 4 if self.layout.fp32_main_grads else self.model.dtype_bytes

    @property
    def grad_dtype(self) -> str:
        return "fp32" if self.layout.fp32_main_grads else self.model.data_dtype

    @property
    def last_microbatch(self) -> int:
        return self.layout.num_microbatches - 1

    def ends_chunk(self, microbatch: int) -> bool:
        """Whether `microbatch` is the last a chunk of this rank runs: the step's last, or
        under dualpipe the first copy's last too (m/2 - 1: `traces.dualpipe_order`)."""
        return microbatch == self.last_microbatch or (
            self.layout.schedule is Schedule.DUALPIPE
            and microbatch == self.layout.num_microbatches // 2 - 1)

    def peer(self, stage: int, microbatch: int = 0) -> int:
        """The rank that runs virtual stage `stage` in this rank's pipeline (dualpipe: for
        `microbatch`'s copy, `traces.schedule_rules.dualpipe_rank`)."""
        layout = self.layout
        at = dualpipe_rank(layout.pp, layout.num_microbatches, stage, microbatch) \
            if layout.schedule is Schedule.DUALPIPE else layout.stage_rank(stage)
        return layout.rank_of(layout.coords(self.rank).moved(Axis.PP, at))

    def unit_params(self, unit: Unit) -> float:
        """Parameters of one unit held by this rank (per TP rank, before ZeRO sharding), but an
        MoE layer's routed experts (`expert_params`)."""
        if unit.part is Part.EMBED:
            return self.model.embedding_params(self.layout.tp)
        if unit.part is Part.HEAD:
            return self.model.head_params_on_stages(
                self.layout.stages_of_rank(self.pp_rank), self.layout.tp)
        assert unit.layer is not None
        layout = self.layout
        extra = mtp_unit_extra(self.model, unit.layer, layout.stages_of_rank(self.pp_rank),
                               layout.tp)  # an MTP depth's own (`traces.mtp`)
        if self.model.experts:  # the experts' own: `expert_params`
            return self.model.layer_params(layout.tp, unit.layer, layout.ep, layout.etp) - \
                self.expert_params(unit.layer) + extra
        return self.model.layer_params(self.layout.tp) + extra

    def expert_params(self, layer: int) -> float:
        """The routed experts' parameters of `layer` on this rank (0 for a dense layer): E/EP
        experts split by ETP; reduced over the expert-data-parallel group."""
        if not is_moe_layer(self.model, layer):
            return 0.0
        m, layout = self.model, self.layout
        return m.experts / layout.ep * moe_expert_params(m) / layout.etp

    def replicated_params(self, unit: Unit) -> float:
        """Parameters of one unit that every TP rank holds in full: a layer's two norms and
        its row-parallel biases (GPT: 6h; an MoE layer's experts keep their own), latent
        attention's down-projection and latent norms (`traces.mla`) or qk_norm's weights
        (`traces.heads`), an MoE layer's router
        h·E (Megatron-Core marks TopKRouter's weight sequence_parallel, so SP sums its
        gradient over TP), learned positions (s·h; none with rotary ones), the final norm
        (2h, RMSNorm h)."""
        m = self.model
        if unit.part is Part.EMBED:
            return m.seq_len * m.hidden if m.position == "learned" else 0
        if unit.part is Part.HEAD:
            return m.norm_params
        latent = mla.mla_params(m)[1] if m.mla else m.qk_norm_params
        moe = unit.layer is not None and is_moe_layer(m, unit.layer)
        router = m.hidden * m.experts if moe else 0
        # Row-parallel biases: the attention projection's and the MLP's fc2's; an MoE layer
        # has no fc2 of its own (its experts' biases are theirs: `ModelSpec.layer_params`).
        biases = 0 if not m.bias else m.hidden * (1 if moe else 2)
        mtp = 3 * m.norm_params if unit.layer is not None and unit.layer >= m.layers else 0
        return biases + 2 * m.norm_params + latent + router + mtp  # MTP: enorm, hnorm, final

    def tp_partial_params(self, unit: Unit) -> float:
        """Parameters of one unit whose gradient each TP rank holds only in part, summed over
        the TP group before the DP reduction (`SpGrads`): with SP, every replicated one (each
        rank saw its sequence shard); without, latent attention's down-projection and latent
        norms, or qk_norm's weights (each rank back-propagates only its heads' share into
        them; Megatron-Core all-reduces q_layernorm and k_layernorm over TP either way)."""
        if self.layout.tp == 1:
            return 0
        if self.layout.sp:
            return self.replicated_params(unit)
        if unit.part is Part.LAYER and self.model.mla:
            return mla.mla_params(self.model)[1]
        return self.model.qk_norm_params if unit.part is Part.LAYER else 0


def first_compute(nodes: Iterable[Node]) -> Node:
    return next(n for n in nodes if n.on_compute)


def last_compute(nodes: list[Node]) -> Node:
    return next(n for n in reversed(nodes) if n.on_compute)


def finalize(program: Program) -> tuple[Op, ...]:
    """The ops in program order, with `after` turned into `deps` indices.

    The ops were built by the passes and have not escaped yet, so their `deps` are set in place.
    """
    nodes = list(chain.from_iterable(program))
    deque(map(setattr, nodes, repeat("index"), count()), maxlen=0)  # node.index = i, in C
    for node in compress(nodes, map(_AFTER, nodes)):  # those that wait for something
        after = node.after  # most wait for one op: that tuple made inline
        deps = node.op.deps = (after[0].index,) if len(after) == 1 else \
            tuple(map(_INDEX, after))
        assert -1 not in deps, f"{node.op.name} waits for an op a pass left out of the plan"
    return tuple(map(_OP, nodes))


_INDEX = attrgetter("index")
_OP = attrgetter("op")
_AFTER = attrgetter("after")
