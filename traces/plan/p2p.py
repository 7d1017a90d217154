"""Pass 3: pipeline sends and receives between virtual stages.

A forward on stage s > 0 first receives its input activations from stage s - 1 (tag "act");
a forward on any stage but the last sends its output on. A backward on any stage but the
last receives the gradient of its output from stage s + 1 (tag "grad"); a backward on s > 0
sends the gradient of its input back. Receives are posted at the start of the action and the
action's first compute op waits for them. Megatron-LM's sends are blocking: the next action
(and the optimizer step) starts once the previous action's output has been handed over; as
receives are posted ahead, this never deadlocks. Under the interleaved schedule Megatron-Core
overlaps them (`overlap_p2p_comm`, its default there; megatron/core/pipeline_parallel/
schedules.py, forward_backward_pipelining_with_interleaving): a forward's send goes out
together with the next forward's receive and is waited for only before that next forward
(`fwd_wait_handles`), a backward's before the next backward, so in the steady state each
message moves beside the other direction's chunk. Here a send then blocks only the next
action of its kind (and the optimizer step). The zero-bubble schedules run as PyTorch's
_PipelineScheduleRuntime runs them: sends are isends that no later action waits for (blocking
sends deadlock zbv's V, whose ranks send to each other both ways). Under DualPipe a stage's
peers depend on the micro-batch's copy (`RankContext.peer`): the second copy flows from the
last rank to the first, on the second leg's streams, and the middle ranks pp/2 - 1 and pp/2
send to each other in both directions.

Each send and receive carries `layer`: the layer of its own stage whose input or output it
carries (an activation sent on: the output of the stage's last layer; received: the input of
its first layer; a gradient received: of the last layer's output; sent back: of the first
layer's input); its purpose (`PipeMessage`) names the boundary: the layer whose input it is.
A stage without layers (`pipeline_layout`'s "E|...", "...|L" or an empty stage) has one
boundary for its input and its output, and its messages carry no layer; a stage with nothing
to compute at all passes what it receives straight on: its send waits for its receive.

Under tensor parallelism every TP rank sends only its 1/t of the activation (or gradient):
b·s·h/t bytes. With SP the tensor is already the rank's sequence shard. Without SP, Megatron-LM
(p2p_communication with scatter_gather_tensors_in_pipeline, its default) sends the rank's
chunk of the flattened tensor and, once received, all-gathers the chunks over the TP group
(over NVLink, inline on the compute stream): a `tp` all-gather of the b·s·h buffer right
after each receive, which waits for the receive (and the previous action's send) and which the
action's first kernel waits for.
"""

from __future__ import annotations

from traces.layout import Axis, Schedule
from traces.ops import Op, OpKind, Phase, Stream
from traces.pipeline import Action
from traces.plan.nodes import Node, Program, RankContext, first_compute, last_compute
from traces.purpose import MessageGather, PipeMessage, Tag
from traces.schedule_rules import V_SHAPED
from traces.zero_bubble import splits_backward

# (receive stream, tag, stage offset of the peer) and the same for sends, per action kind.
_RECV = {"F": (Stream.RECV_PREV, Tag.ACT, -1), "B": (Stream.RECV_NEXT, Tag.GRAD, +1)}
_SEND = {"F": (Stream.SEND_NEXT, Tag.ACT, +1), "B": (Stream.SEND_PREV, Tag.GRAD, -1)}
_PHASE = {"F": Phase.FWD, "B": Phase.BWD}
_LEG2 = {Stream.RECV_PREV: Stream.RECV_PREV_V, Stream.RECV_NEXT: Stream.RECV_NEXT_V,
         Stream.SEND_NEXT: Stream.SEND_NEXT_V, Stream.SEND_PREV: Stream.SEND_PREV_V}
"""zbv's second leg (stages pp..2pp-1) talks to other peers in another order: its messages
queue on streams of their own, each stream one peer and one tag, in micro-batch order."""


def add_pipeline_p2p(ctx: RankContext, actions: list[Action], program: Program) -> Program:
    """Insert receives (and, without SP under TP, their all-gathers) and sends;
    `program[k]` holds the ops of `actions[k]`."""
    layout = ctx.layout
    full = ctx.local_model.activation_bytes(layout.micro_batch)  # CP: s/cp tokens
    size = full / layout.tp
    gather = layout.tp > 1 and not layout.sp
    group = layout.group(ctx.rank, Axis.TP)
    out: Program = []
    overlap = layout.overlap_p2p_comm and layout.schedule is Schedule.INTERLEAVED
    pending: dict[str, Node | None] = {"F": None, "B": None}  # the last send of each kind
    ends: dict[int, tuple[int, int]] = {}  # stage -> its first and last layer (last + 1 =
    # first where it has none)
    peers: dict[object, int] = {}  # stage (dualpipe: and copy) -> the rank that runs it
    # zero-bubble schedules as PyTorch's _PipelineScheduleRuntime runs them: sends are
    # batched isends, waited for only at the end of the step (`traces.zero_bubble`)
    detached = splits_backward(layout.schedule)
    leg2 = str(layout.schedule) in V_SHAPED
    # DualPipe: a stage's peers differ by copy (direction); the second copy's messages go on
    # the second leg's streams, as zbv's
    dual = layout.schedule is Schedule.DUALPIPE
    half = layout.num_microbatches // 2
    for action, nodes in zip(actions, program):
        kind, stage, mb = action.kind, action.stage, action.microbatch
        if kind == "W":  # weight gradients: nothing to send or receive
            out.append(nodes)
            continue
        if stage not in ends:
            layers = layout.layers_of_stage(ctx.model, stage)
            ends[stage] = layers.start, layers.stop - 1
        first, last = ends[stage]
        own = first <= last  # the stage holds layers: its messages name one of them
        before = None if detached else pending[kind] if overlap else \
            pending["F"] or pending["B"]
        entry = [] if before is None else [before]
        step: list[Node] = []
        second = stage >= layout.pp if leg2 else dual and mb >= half
        stream, tag, offset = _RECV[kind]
        stream = _LEG2[stream] if second else stream
        if _remote(ctx, peers, stage + offset, mb):
            # an activation in is the first layer's input; a gradient in, of the last's output
            boundary = first if kind == "F" else last + 1
            recv = _p2p(OpKind.RECV, stream, _peer(ctx, peers, stage + offset, mb), size, tag,
                        mb,
                        (first if kind == "F" else last) if own else None, boundary)
            step.append(recv)
            entry.append(recv)
            if gather:
                op = Op(kind=OpKind.ALL_GATHER, stream=Stream.COMPUTE, name="tp",
                        purpose=MessageGather(tag, boundary), group=group, size_bytes=full,
                        microbatch=mb, phase=_PHASE[kind], dtype=ctx.model.data_dtype)
                gathered = Node(op, None, entry)
                step.append(gathered)
                entry = [gathered]
        computes = any(node.on_compute for node in nodes)
        if computes:
            first_compute(nodes).wait_first(entry)
        step += nodes
        if not overlap:
            pending = {"F": None, "B": None}
        pending[kind] = None
        stream, tag, offset = _SEND[kind]
        stream = _LEG2[stream] if second else stream
        if _remote(ctx, peers, stage + offset, mb):
            # an activation out is the next layer's input; a gradient back, the first's
            send = pending[kind] = _p2p(
                OpKind.SEND, stream, _peer(ctx, peers, stage + offset, mb), size, tag, mb,
                (last if kind == "F" else first) if own else None,
                last + 1 if kind == "F" else first)
            if computes:
                send.wait_for(last_compute(nodes))
            else:  # nothing to compute: hand on what came in
                send.wait_first(entry)
            step.append(send)
        out.append(step)
    return [*out, *program[len(actions):]]


def _remote(ctx: RankContext, peers: dict[object, int], stage: int, mb: int) -> bool:
    """Whether virtual stage `stage` exists and runs on another rank (zbv's V turns on the
    last rank: its two stages meet there, and the tensor stays on the GPU)."""
    return 0 <= stage <= ctx.last_stage and _peer(ctx, peers, stage, mb) != ctx.rank


def _peer(ctx: RankContext, peers: dict[object, int], stage: int, mb: int) -> int:
    """`ctx.peer(stage, mb)`, found once per stage (under dualpipe, per stage and copy)."""
    key = (stage, mb >= ctx.layout.num_microbatches // 2) \
        if ctx.layout.schedule is Schedule.DUALPIPE else stage
    if key not in peers:
        peers[key] = ctx.peer(stage, mb)
    return peers[key]


def _p2p(kind: OpKind, stream: Stream, peer: int, size: float, tag: Tag, mb: int,
         layer: int | None, boundary: int) -> Node:
    return Node(Op(kind=kind, stream=stream, purpose=PipeMessage(tag, boundary), peer=peer,
                   size_bytes=size, tag=str(tag), microbatch=mb, layer=layer))
