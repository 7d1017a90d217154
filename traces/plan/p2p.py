"""Pass 3: pipeline sends and receives between virtual stages.

A forward on stage s > 0 first receives its input activations from stage s - 1 (tag "act");
a forward on any stage but the last sends its output on. A backward on any stage but the
last receives the gradient of its output from stage s + 1 (tag "grad"); a backward on s > 0
sends the gradient of its input back. Receives are posted at the start of the action and the
action's first compute op waits for them. Megatron-LM's sends are blocking: the next action
(and the optimizer step) starts once the previous action's output has been handed over; as
receives are posted ahead, this never deadlocks.
"""

from __future__ import annotations

from traces.ops import Op, OpKind, Stream
from traces.pipeline import Action
from traces.plan.nodes import Node, Program, RankContext, first_compute, last_compute

# (receive stream, tag, stage offset of the peer) and the same for sends, per action kind.
_RECV = {"F": (Stream.RECV_PREV, "act", -1), "B": (Stream.RECV_NEXT, "grad", +1)}
_SEND = {"F": (Stream.SEND_NEXT, "act", +1), "B": (Stream.SEND_PREV, "grad", -1)}


def add_pipeline_p2p(ctx: RankContext, actions: list[Action], program: Program) -> Program:
    """Insert receives and sends; `program[k]` holds the ops of `actions[k]`."""
    size = ctx.model.activation_bytes(ctx.layout.micro_batch) / (
        ctx.layout.tp if ctx.layout.sp else 1)
    out: Program = []
    pending: Node | None = None  # the previous action's send
    for action, nodes in zip(actions, program):
        kind, stage, mb = action.kind, action.stage, action.microbatch
        entry = [] if pending is None else [pending]
        step: list[Node] = []
        stream, tag, offset = _RECV[kind]
        if 0 <= stage + offset <= ctx.last_stage:
            recv = _p2p(OpKind.RECV, stream, ctx.peer(stage + offset), size, tag, mb)
            step.append(recv)
            entry.append(recv)
        first_compute(nodes).after[:0] = entry
        step += nodes
        pending = None
        stream, tag, offset = _SEND[kind]
        if 0 <= stage + offset <= ctx.last_stage:
            pending = _p2p(OpKind.SEND, stream, ctx.peer(stage + offset), size, tag, mb)
            pending.after.append(last_compute(nodes))
            step.append(pending)
        out.append(step)
    return [*out, *program[len(actions):]]


def _p2p(kind: OpKind, stream: Stream, peer: int, size: float, tag: str, mb: int) -> Node:
    return Node(Op(kind=kind, stream=stream, peer=peer, size_bytes=size, tag=tag,
                   microbatch=mb))
