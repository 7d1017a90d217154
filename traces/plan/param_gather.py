"""overlap_param_gather: ZeRO-1/2's parameter all-gathers overlapped with the next forward.

Megatron-Core's distributed optimizer with --overlap-param-gather does not gather the updated
parameters at the end of the step: each bucket group's all-gather is dispatched
asynchronously, and the forward pre-hook of a bucket's first parameter waits for it
(`finish_param_sync`) and then dispatches the next bucket group's, in reverse bucket order:
the buckets were cut in backward order, so the forward needs the last one first
(megatron/core/distributed/distributed_data_parallel.py sets `next_param_gather_bucket_group`
"in reverse order (since all-gathers happen in reverse order of buckets)"; the first is
dispatched when the step begins).

A plan is one step in steady state, so the gathers of the previous step's update open it:

    gather j          on the dp stream (in order), of bucket j in order of first forward use
    first use of j    the first forward compute op of a unit of bucket j waits for gather j
    gather j + 1      issued when the compute stream reaches the first use of bucket j (it
                      waits for the compute op before that use), after gather j (stream order)

Each gather sits right after the op it waits for, so dependencies point backwards.

With the interleaved schedule (vp > 1) Megatron-Core aligns the gathers instead
(`align_param_gather`, Megatron-LM's default there; the non-interleaved schedule turns it
off): each model chunk is its own DDP instance, and the schedule dispatches a whole chunk's
gathers at once, in its bucket order, through `config.param_sync_func`
(megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving):

    chunks 0 and 1    at the start of the step ("Synchronize params for first two model
                      chunks")
    chunk c >= 2      before the forward of virtual micro-batch k = (c - 1)·pp - r on pipeline
                      rank r: there k + r is the first micro-batch of chunk c - 1, so every
                      stage dispatches chunk c at about the same time

and a bucket's first forward use waits for its gather without dispatching the next
(`finish_param_sync(skip_next_bucket_dispatch=True)`). `aligned_before_forward` places them
so. Buckets are whole units (a layer of GPT-3 175B at tp 8 is 453 MB), so the one-ahead chain
can run only one layer ahead: with a pipeline its gathers can cost more than they hide.
"""

from __future__ import annotations

from traces.ops import Op, Phase
from traces.plan.nodes import Node, Program
from traces.purpose import Unit


def gathers_before_forward(program: Program, gathers: list[tuple[Op, list[Unit]]]) -> Program:
    """`program` with each gather (its op and its bucket's units) placed and chained as the
    module docstring says; a bucket none of whose units runs forward here is gathered at the
    step's start."""
    at = _Positions(program)
    inserts: dict[tuple[int, int], list[Node]] = {}  # after (action, index); START: first
    trigger = START
    for op, units in sorted(gathers, key=lambda g: at.first_use(g[1])):
        gather = _issue(program, inserts, op, trigger)
        first = at.first_use(units)
        if first < len(at.compute):
            at.compute[first][2].wait_for(gather)
            if first > 0:
                trigger = at.before(first)
    return _placed(program, inserts)


def aligned_before_forward(program: Program, gathers: list[tuple[Op, list[Unit]]],
                           chunks: list[int], dispatch: dict[int, int]) -> Program:
    """`program` (an interleaved rank's) with each gather (its op, its bucket's units, its
    model chunk `chunks[i]`) dispatched with its chunk as the module docstring says:
    `dispatch[c]` is the schedule action before whose first compute op chunk c's gathers are
    issued (absent: at the step's start), each after the compute op before it and after the
    previous gather on its stream; each bucket's first forward use waits for its gather."""
    at = _Positions(program)
    inserts: dict[tuple[int, int], list[Node]] = {}
    # chunk by chunk, each in its bucket order (a stable sort)
    for (op, units), chunk in sorted(zip(gathers, chunks, strict=True), key=lambda g: g[1]):
        opened = at.opens.get(dispatch[chunk], 0) if chunk in dispatch else 0
        gather = _issue(program, inserts, op, at.before(opened))
        first = at.first_use(units)
        if first < len(at.compute):
            at.compute[first][2].wait_for(gather)
    return _placed(program, inserts)


START = (0, -1)
"""Where a gather issued at the step's start is placed: before the program's first node."""


class _Positions:
    """A program's compute nodes in order, as (action, index, node); where each unit is first
    used forward and where each action's compute begins, as positions among them."""

    def __init__(self, program: Program) -> None:
        self.compute = [(a, i, node) for a, nodes in enumerate(program)
                        for i, node in enumerate(nodes) if node.on_compute]
        self.firsts: dict[Unit, int] = {}
        self.opens: dict[int, int] = {}
        for position, (a, _, node) in enumerate(self.compute):
            self.opens.setdefault(a, position)
            if node.unit is not None and node.op.phase is Phase.FWD:
                self.firsts.setdefault(node.unit, position)

    def first_use(self, units: list[Unit]) -> int:
        """The first forward use of any of `units` (past the end: none)."""
        end = len(self.compute)
        return min((self.firsts.get(u, end) for u in units), default=end)

    def before(self, position: int) -> tuple[int, int]:
        """Where an op issued as the compute stream reaches `position` goes: right after the
        compute node before it (START at the first)."""
        return self.compute[position - 1][:2] if position > 0 else START


def _issue(program: Program, inserts: dict[tuple[int, int], list[Node]], op: Op,
           trigger: tuple[int, int]) -> Node:
    """A gather placed after `trigger`'s node, waiting for it (for nothing at START)."""
    gather = Node(op, None, [] if trigger == START else [program[trigger[0]][trigger[1]]])
    inserts.setdefault(trigger, []).append(gather)
    return gather


def _placed(program: Program, inserts: dict[tuple[int, int], list[Node]]) -> Program:
    """`program` with `inserts[(a, i)]` after node i of action a ((0, -1): first of all)."""
    out: Program = []
    for a, nodes in enumerate(program):
        step = list(inserts.get((a, -1), [])) if a == 0 else []
        for i, node in enumerate(nodes):
            step.append(node)
            step += inserts.get((a, i), [])
        out.append(step)
    return out
