"""Pass: activation CPU offloading's copies (`[parallel] cpu_offloading_num_layers`,
`traces.cpu_offload`), as Transformer Engine's offload handler issues them.

Megatron-Core's TransformerBlock takes its offload context from Transformer Engine's
get_cpu_offload_context (AsyncDoubleBufferGroupOffloadHandler, transformer_engine/pytorch/
cpu_offload_v1.py): the first N layers' saved activations go to host memory on a d2h stream
and come back on an h2d stream, their syncs spread over the L layers by its `layer_window_map`
(`traces.cpu_offload.windows`: w). For each micro-batch:

    offload j   stream `d2h`: offload 0 after layer 0's forward, offload j + 1 after layer
                w[j]'s forward (and offload j: one copy at a time); the compute after layer
                w[j]'s forward (the next layer's, or the output layer's) waits for offload j
    reload j    stream `h2d`, in backward order: after the compute before layer w[j]'s
                backward (and reload j + 1); layer w[j]'s backward waits for reload j + 1,
                layer 0's for reload 0

Each copy carries `activation_bytes_per_layer` (`traces.stored_activations`) and is timed by
the simulator at the host link's bandwidth (`sim.models.compute`). The closed form of the same
rules is `traces.cpu_offload.micro_batch_s`. Megatron-Core refuses offloading with pipeline
parallelism and recomputation (`traces.cpu_offload.check`), so a rank runs every layer and a
micro-batch's forward and backward are one action each.
"""

from __future__ import annotations

from traces.cpu_offload import windows
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
    w = windows(ctx.model.layers, offloaded)
    out: Program = []
    for nodes, action in zip(program[:-1], actions, strict=True):
        if action.kind == "F":
            nodes = _offloads(nodes, w, size)
        elif action.kind == "B":
            nodes = _reloads(nodes, w, size)
        out.append(nodes)
    return [*out, program[-1]]


def _copy(layer: int, microbatch: int | None, size: float, reload: bool) -> Op:
    return Op(kind=OpKind.COMPUTE, stream=Stream.H2D if reload else Stream.D2H,
              name="reload" if reload else "offload",
              purpose=HostCopy(Unit.of_layer(layer), reload), layer=layer,
              microbatch=microbatch, phase=Phase.BWD if reload else Phase.FWD,
              size_bytes=size)


def _layer_ends(compute: list[Node], phase: Phase) -> tuple[dict[int, Node], dict[int, Node]]:
    """Per layer, its first and last compute op of `phase`."""
    first: dict[int, Node] = {}
    last: dict[int, Node] = {}
    for node in compute:
        layer = node.op.layer
        if layer is not None and node.op.phase is phase:
            first.setdefault(layer, node)
            last[layer] = node
    return first, last


def _offloads(nodes: list[Node], w: tuple[int, ...], size: float) -> list[Node]:
    """A forward's nodes with offload 0 after layer 0's last op, offload j + 1 after layer
    w[j]'s, and the compute op after layer w[j]'s waiting for offload j."""
    compute = [node for node in nodes if node.on_compute]
    _, last = _layer_ends(compute, Phase.FWD)
    following = {id(a): b for a, b in zip(compute, compute[1:], strict=False)}
    after: dict[int, Node] = {}  # id(layer's last op) -> the copy issued after it
    copies: list[Node] = []
    for j in range(len(w)):
        at = last.get(0 if j == 0 else w[j - 1])
        if at is None:
            continue
        copy = Node(_copy(j, at.op.microbatch, size, False), None, [at])
        after[id(at)] = copy
        copies.append(copy)
    for j, window in enumerate(w[:len(copies)]):
        end = last.get(window)
        nxt = following.get(id(end)) if end is not None else None
        if nxt is not None:
            nxt.wait_for(copies[j])
    return _issued_after(nodes, after)


def _reloads(nodes: list[Node], w: tuple[int, ...], size: float) -> list[Node]:
    """A backward's nodes with reload j after the compute op before layer w[j]'s first,
    layer w[j]'s first op waiting for reload j + 1, and layer 0's for reload 0."""
    compute = [node for node in nodes if node.on_compute]
    first, _ = _layer_ends(compute, Phase.BWD)
    before = {id(b): a for a, b in zip(compute, compute[1:], strict=False)}
    after: dict[int, Node] = {}  # id(gate) -> the reload issued after it
    leading: list[Node] = []  # reloads with no compute op before their layer's backward
    reloads: dict[int, Node] = {}
    for j in reversed(range(len(w))):
        start = first.get(w[j])
        if start is None:
            continue
        gate = before.get(id(start))
        copy = Node(_copy(j, start.op.microbatch, size, True), None,
                    [gate] if gate is not None else None)
        reloads[j] = copy
        if gate is None:
            leading.append(copy)
        else:
            after[id(gate)] = copy
        if j + 1 in reloads:
            start.wait_for(reloads[j + 1])
    if 0 in reloads and 0 in first:
        first[0].wait_for(reloads[0])
    return _issued_after(nodes, after, leading)


def _issued_after(nodes: list[Node], after: dict[int, Node],
                  leading: list[Node] | None = None) -> list[Node]:
    """`nodes` in order with each copy right after the node it is issued behind (`after`:
    id(node) -> copy), the copies with no node before them (`leading`) first."""
    out: list[Node] = list(leading or ())
    for node in nodes:
        out.append(node)
        issued = after.get(id(node))
        if issued is not None:
            out.append(issued)
    return out
