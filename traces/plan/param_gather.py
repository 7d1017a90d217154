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

Where Megatron-Core differs, left as it is: it chains the buckets of each model chunk (each a
DDP instance) separately, the first of chunks 0 and 1 dispatched when their first forward
waits for it, and those of chunks 2 and up by the interleaved schedule at the same time on
every pipeline stage (`align_param_gather`, Megatron-LM's default); here one chain runs
through all the rank's buckets in order of first use, its first dispatched when the step
begins (the steady state of older Megatron-Core, which dispatched it in zero_grad). Buckets
are whole units (a layer of GPT-3 175B at tp 8 is 453 MB), so a chain can run one layer ahead
only: with a pipeline its gathers can cost more than they hide.
"""

from __future__ import annotations

from traces.ops import Op, Phase
from traces.plan.nodes import Node, Program
from traces.purpose import Unit


def gathers_before_forward(program: Program, gathers: list[tuple[Op, list[Unit]]]) -> Program:
    """`program` with each gather (its op and its bucket's units) placed and chained as the
    module docstring says; a bucket none of whose units runs forward here is gathered at the
    step's start."""
    flat = [(a, i, node) for a, nodes in enumerate(program) for i, node in enumerate(nodes)]
    compute = [(a, i, node) for a, i, node in flat if node.on_compute]
    firsts: dict[Unit, int] = {}  # unit -> position in `compute` of its first forward op
    for position, (_, _, node) in enumerate(compute):
        if node.unit is not None and node.op.phase is Phase.FWD:
            firsts.setdefault(node.unit, position)
    end = len(compute)
    order = sorted(gathers, key=lambda g: min((firsts.get(u, end) for u in g[1]), default=end))
    inserts: dict[tuple[int, int], list[Node]] = {}  # after (action, index); (0, -1): start
    trigger: tuple[int, int] = (0, -1)
    for op, units in order:
        gather = Node(op, None, [])
        if trigger != (0, -1):
            gather.after.append(program[trigger[0]][trigger[1]])
        inserts.setdefault(trigger, []).append(gather)
        first = min((firsts.get(u, end) for u in units), default=end)
        if first < end:
            compute[first][2].after.append(gather)
            if first > 0:
                trigger = compute[first - 1][:2]
    out: Program = []
    for a, nodes in enumerate(program):
        step = list(inserts.get((a, -1), [])) if a == 0 else []
        for i, node in enumerate(nodes):
            step.append(node)
            step += inserts.get((a, i), [])
        out.append(step)
    return out
