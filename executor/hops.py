"""DeepEP / HybridEP token exchange in the executor: two all-to-alls over the EP group, the
network hop once per destination node, then forwarding inside the node (`traces.deepep`).

Nodes are emulated on gloo: EP member j lives on node `global rank // gpus_per_node`
(`RunOptions.gpus_per_node`, the cluster's; HybridEP's NVLink domain is the cluster's server
too, `traces.hybridep`). Source i's relay on node N is the member of N at i's own position on
its node (modulo N's size), as DeepEP's internode kernels pick the GPU of the same local index.

    dispatch  hop 1: i sends each other node's relay each distinct token bound for any expert
              on that node, once (its row of a2, a "content" label (i, t));
              hop 2: a relay forwards to each member of its node the distinct tokens bound for
              that member's experts, and i sends its own node's members theirs directly;
              each member then expands its rows per (expert, token) as NCCL's would arrive
    combine   the reverse way: hop 1 inside the node (expert rank to the source's relay, or
              to the source on the same node), hop 2 across nodes to the source; rows per
              (token, expert) pair, since the executor applies the gates at the source
              (its unpermute), where DeepEP's combine sums a token's rows in the node first

Each hop is a gather of labelled rows and an `all_to_all_single`; the backward runs the hops
in reverse, a gather's transpose being an index_add (a token forwarded to several experts gets
their gradients summed on the way back). Every rank derives every index from the routing,
which all ranks share (`executor.routing`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

Label = Hashable
Exchange = Callable[[torch.Tensor, torch.Tensor, list[int], list[int]], None]
"""(output, input, input_splits, output_splits): one all_to_all_single over the EP group."""


@dataclass(frozen=True, slots=True)
class Hop:
    """One rank's part of one hop: rows `index` of its buffer sent, `sent[j]` to member j,
    `got[j]` received from member j (appended to the buffer)."""

    index: torch.Tensor
    sent: list[int]
    got: list[int]


@dataclass(frozen=True, slots=True)
class HopPlan:
    """One rank's exchange: its hops, then rows `final` of the last buffer as the output."""

    start: int
    hops: tuple[Hop, ...]
    final: torch.Tensor

    def forward(self, value: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        buf = value
        for hop in self.hops:
            recv = buf.new_empty((sum(hop.got), buf.shape[-1]))
            exchange(recv, buf[hop.index].contiguous(), hop.sent, hop.got)
            buf = torch.cat([buf, recv])
        return buf[self.final]

    def backward(self, grad: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        sizes = [self.start]
        for hop in self.hops:
            sizes.append(sizes[-1] + sum(hop.got))
        buf = grad.new_zeros((sizes[-1], grad.shape[-1])).index_add_(0, self.final, grad)
        for hop, before in zip(reversed(self.hops), reversed(sizes[:-1])):
            back = buf.new_empty((sum(hop.sent), buf.shape[-1]))
            exchange(back, buf[before:].contiguous(), hop.got, hop.sent)
            buf = buf[:before].index_add(0, hop.index, back)
        return buf


def plan_hops(me: int, starts: Sequence[Sequence[Label]],
              hops: Sequence[Callable[[int, int], list[Label]]],
              wanted: Sequence[Label]) -> HopPlan:
    """Member `me`'s `HopPlan`: every member's buffer starts as `starts[j]`; in each hop,
    member p sends member q the rows labelled `hop(p, q)` (taken from its buffer, the first
    row with that label); `wanted` are `me`'s output rows in order."""
    buffers = [list(s) for s in starts]
    n = len(buffers)
    mine: list[Hop] = []
    for hop in hops:
        sends = [[hop(p, q) for q in range(n)] for p in range(n)]
        first = _first_rows(buffers[me])
        index = [first[label] for q in range(n) for label in sends[me][q]]
        mine.append(Hop(torch.tensor(index, dtype=torch.long), [len(s) for s in sends[me]],
                        [len(sends[p][me]) for p in range(n)]))
        buffers = [b + [label for p in range(n) for label in sends[p][q]]
                   for q, b in enumerate(buffers)]
    first = _first_rows(buffers[me])
    return HopPlan(len(starts[me]), tuple(mine),
                   torch.tensor([first[label] for label in wanted], dtype=torch.long))


def _first_rows(buffer: list[Label]) -> dict[Label, int]:
    out: dict[Label, int] = {}
    for i, label in enumerate(buffer):
        out.setdefault(label, i)
    return out
