"""Pass: activation CPU offloading's copies (`[parallel] cpu_offloading_num_layers`,
`traces.cpu_offload`), as Transformer Engine's double-buffered offload handler issues them.

For each micro-batch and each of the first N layers (those TE offloads, in forward order):

    d2h   after the layer's forward, on stream `d2h`: its stored activations to host memory;
          the forward of the layer two ahead waits for it (the double buffer frees a slot),
          and the micro-batch's backward waits for the last of them
    h2d   on stream `h2d`, in backward order, once the backward of the layer two ahead has
          begun (for the top two: once the micro-batch's backward has begun): the activations
          back; the layer's backward waits for it

Each copy carries `activation_bytes_per_layer` (`traces.stored_activations`) and is timed by
the simulator at the host link's bandwidth (`sim.models.compute`); a copy stream runs one copy
at a time, so the copies of one direction follow each other. The closed form of the same rules
is `traces.cpu_offload.micro_batch_s`. Megatron-Core refuses offloading with pipeline
parallelism and recomputation (`traces.cpu_offload.check`), so a rank runs every layer and a
micro-batch's forward and backward are one action each.
"""

from __future__ import annotations

from traces.cpu_offload import RESIDENT_BUFFER_LAYERS
from traces.ops import Op, OpKind, Phase, Stream
from traces.pipeline import Action
from traces.plan.nodes import Node, Program, RankContext
from traces.purpose import HostCopy, Unit
from traces.stored_activations import activation_bytes_per_layer


def add_cpu_offload(ctx: RankContext, actions: list[Action], program: Program) -> Program:
    """The offload (d2h) and reload (h2d) copies of the first `cpu_offloading_num_layers`
    layers of every micro-batch; nothing without the key."""
    offloaded = ctx.layout.cpu_offloading_num_layers
    if not offloaded:
        return program
    size = activation_bytes_per_layer(ctx.model, ctx.layout)
    layers = ctx.model.layers
    before: dict[int, list[Node]] = {}  # per micro-batch: its forward's last op and copy
    out: Program = []
    for nodes, action in zip(program[:-1], actions, strict=True):
        if action.kind == "F":
            nodes, last = _offloads(nodes, offloaded, size)
            ends = [n for n in nodes if n.on_compute][-1:]
            before[action.microbatch] = ends + ([last] if last is not None else [])
        elif action.kind == "B":
            nodes = _reloads(nodes, offloaded, layers, size, before.get(action.microbatch, []))
        out.append(nodes)
    return [*out, program[-1]]


def _copy(layer: int, microbatch: int | None, size: float, reload: bool) -> Op:
    return Op(kind=OpKind.COMPUTE, stream=Stream.H2D if reload else Stream.D2H,
              name="reload" if reload else "offload",
              purpose=HostCopy(Unit.of_layer(layer), reload), layer=layer,
              microbatch=microbatch, phase=Phase.BWD if reload else Phase.FWD,
              size_bytes=size)


def _offloads(nodes: list[Node], offloaded: int, size: float) -> tuple[list[Node], Node | None]:
    """A forward's nodes with a d2h copy after each offloaded layer's last compute op, and the
    forward of layer i + 2 waiting for layer i's; and the last copy."""
    last_op: dict[int, Node] = {}
    first_op: dict[int, Node] = {}
    for node in nodes:
        layer = node.op.layer
        if node.on_compute and layer is not None and node.op.phase is Phase.FWD:
            first_op.setdefault(layer, node)
            last_op[layer] = node
    copies: dict[int, Node] = {}
    out: list[Node] = []
    for node in nodes:
        out.append(node)
        layer = node.op.layer
        if layer is not None and layer < offloaded and last_op.get(layer) is node:
            copy = Node(_copy(layer, node.op.microbatch, size, False), None, [node])
            copies[layer] = copy
            out.append(copy)
    for layer, copy in copies.items():
        ahead = first_op.get(layer + RESIDENT_BUFFER_LAYERS)
        if ahead is not None:
            ahead.wait_for(copy)
    return out, (copies[max(copies)] if copies else None)


def _reloads(nodes: list[Node], offloaded: int, layers: int, size: float,
             before: list[Node]) -> list[Node]:
    """A backward's nodes with its first compute op waiting for the forward's last d2h copy,
    an h2d copy of each offloaded layer once the layer two ahead begins its backward (after
    the compute op before it; the top two: once the backward may begin, after `before`, the
    forward's last compute op and last copy), and each layer's backward waiting for its copy."""
    compute = [node for node in nodes if node.on_compute]
    if not compute:
        return nodes
    first_op: dict[int, Node] = {}
    previous: dict[int, Node] = {}  # id(a layer's first backward op) -> the op before it
    for prior, node in zip([None, *compute], compute, strict=False):
        layer = node.op.layer
        if layer is not None and layer not in first_op:
            first_op[layer] = node
            if prior is not None:
                previous[id(node)] = prior
    for node in before[1:]:
        compute[0].wait_for(node)
    gated: dict[int, list[int]] = {}  # id(gate) -> the layers reloaded once it ends
    top: list[int] = []  # those reloaded once the backward may begin
    for layer in reversed(range(min(offloaded, layers))):
        ahead = first_op.get(layer + RESIDENT_BUFFER_LAYERS)
        gate = previous.get(id(ahead)) if ahead is not None else None
        if gate is None:
            top.append(layer)
        else:
            gated.setdefault(id(gate), []).append(layer)
    microbatch = compute[0].op.microbatch
    out: list[Node] = []

    def reload(layer: int, after: list[Node]) -> None:
        copy = Node(_copy(layer, microbatch, size, True), None, after)
        out.append(copy)
        target = first_op.get(layer)
        if target is not None:
            target.wait_for(copy)

    for layer in top:
        reload(layer, list(before))
    for node in nodes:
        out.append(node)
        for layer in gated.get(id(node), ()):
            reload(layer, [node])
    return out
