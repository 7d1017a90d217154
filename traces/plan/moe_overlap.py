"""Last pass, with overlap_moe_comm: the EP all-to-alls on their own stream, and each paired
forward and backward (`traces.moe_overlap.pairs`) lowered as one merged step.

Every EP all-to-all (`ExpertAllToAll`) moves to the `ep_comm` stream: it waits for the compute
op before it in its action (the permute, the experts or the unpermute it carries), and the
next compute op of its action waits for it. An action alone keeps its order, so its compute
stream waits for each of its all-to-alls: exposed, as before. A pair's ops are merged: each
action is cut into pieces, each ending with an all-to-all (the last piece: the rest), and the
pieces alternate, the backward's first:

    backward: unpermute, combine's grad a2a   forward: attention, permute, dispatch a2a
    backward: experts, dispatch's grad a2a    forward: experts, combine a2a
    backward: permute, attention, the next layer's unpermute, its combine's grad a2a  ...

which is Megatron-Core's per-layer order (`traces.moe_overlap`) and DeepSeek-V3's for a
DualPipe pair (arXiv 2412.19437, Fig. 4; the backward there is a B and its W, the W's
weight-gradient GEMMs joining the backward's last piece): while one piece's
all-to-all moves, the other action's next piece computes. Nothing is added or removed; the
SMs the all-to-all's NCCL kernels hold while the compute beside it runs are the interference
model's (`sim.models.sharing`: one per NCCL channel).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import zip_longest

from traces.moe_overlap import groups
from traces.ops import Stream
from traces.pipeline import Action
from traces.plan.nodes import Node, Program, RankContext
from traces.purpose import ExpertAllToAll


def overlap_moe_comm(ctx: RankContext, actions: list[Action], program: Program) -> Program:
    """The program with its EP all-to-alls on `ep_comm` and each pair's ops merged."""
    if not ctx.layout.overlap_moe_comm:
        return program
    out = [_on_own_stream(nodes) for nodes in program]
    for group in groups(ctx.layout.schedule, actions):
        backward = [n for i in group if actions[i].kind != "F" for n in out[i]]
        forward = [n for i in group if actions[i].kind == "F" for n in out[i]]
        out[group[0]] = _merged(_pieces(backward), _pieces(forward))
        for i in group[1:]:
            out[i] = []
    return out


def _on_own_stream(nodes: list[Node]) -> list[Node]:
    """The action's nodes, each EP all-to-all moved to `ep_comm` between the compute ops
    before and after it (module docstring)."""
    last: Node | None = None
    pending: list[Node] = []
    for node in nodes:
        if isinstance(node.op.purpose, ExpertAllToAll):
            node.op = replace(node.op, stream=Stream.EP_COMM)
            node.on_compute = False
            if last is not None:
                node.wait_first([last])
            pending.append(node)
        elif node.on_compute:
            for moved in pending:
                node.wait_for(moved)
            pending = []
            last = node
    return nodes


def _pieces(nodes: list[Node]) -> list[list[Node]]:
    """The action's nodes cut after each EP all-to-all."""
    out: list[list[Node]] = [[]]
    for node in nodes:
        out[-1].append(node)
        if isinstance(node.op.purpose, ExpertAllToAll):
            out.append([])
    return [piece for piece in out if piece]


def _merged(backward: list[list[Node]], forward: list[list[Node]]) -> list[Node]:
    """The pieces alternating, the backward's first."""
    none: list[Node] = []
    return [node for b, f in zip_longest(backward, forward, fillvalue=none)
            for piece in (b, f) for node in piece]
