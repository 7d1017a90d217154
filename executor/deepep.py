"""The labelled rows of a DeepEP / HybridEP dispatch and combine (`executor.hops`'s docstring
says what moves where): built from one layer's routing, shared by every EP member."""

from __future__ import annotations

from collections.abc import Sequence

from executor.hops import HopPlan, Label, plan_hops
from executor.routing import Routing


class NodeMap:
    """EP members (positions 0..ep-1) per node and each source's relay on each node."""

    def __init__(self, node_of: Sequence[int]) -> None:
        self.node_of = tuple(node_of)
        self.members: dict[int, list[int]] = {}
        for j, node in enumerate(self.node_of):
            self.members.setdefault(node, []).append(j)

    def relay(self, source: int, node: int) -> int:
        """The member of `node` at `source`'s position on its own node (modulo its size)."""
        position = self.members[self.node_of[source]].index(source)
        members = self.members[node]
        return members[position % len(members)]

    def deliverer(self, source: int, member: int) -> int:
        """Who hands `member` the rows of `source`: the source itself on the same node, else
        the source's relay on the member's node."""
        node = self.node_of[member]
        return source if self.node_of[source] == node else self.relay(source, node)

    def same(self, a: int, b: int) -> bool:
        return self.node_of[a] == self.node_of[b]


def _tokens_of_expert(r: Routing) -> list[list[int]]:
    out, offset = [], 0
    order = r.tokens.tolist()
    for n in r.counts:
        out.append(order[offset:offset + n])
        offset += n
    return out


def dispatch_hops(r: Routing, nodes: NodeMap, me: int) -> HopPlan:
    """Member `me`'s two-hop dispatch: perm rows in, `recv` rows (source-major, per source its
    rows of `me`'s experts by expert, then token) out."""
    ep = len(nodes.node_of)
    per = len(r.counts) // ep
    tok = _tokens_of_expert(r)

    def experts(j: int) -> range:
        return range(j * per, (j + 1) * per)

    def tokens_for(members: Sequence[int]) -> list[int]:
        return sorted({t for j in members for e in experts(j) for t in tok[e]})

    def network(p: int, q: int) -> list[Label]:
        node = nodes.node_of[q]
        if nodes.same(p, q) or q != nodes.relay(p, node):
            return []
        return [(p, t) for t in tokens_for(nodes.members[node])]

    def forward(p: int, q: int) -> list[Label]:
        if p == q or not nodes.same(p, q):
            return []
        return [(s, t) for s in range(ep) if nodes.deliverer(s, q) == p
                for t in tokens_for([q])]

    starts = [[(s, t) for t in r.tokens.tolist()] for s in range(ep)]
    wanted = [(s, t) for s in range(ep) for e in experts(me) for t in tok[e]]
    return plan_hops(me, starts, [network, forward], wanted)


def combine_hops(r: Routing, nodes: NodeMap, me: int) -> HopPlan:
    """Member `me`'s two-hop combine, the reverse way: `eout` rows in (as `recv`), `back` rows
    (its kept assignments by expert, then token) out."""
    ep = len(nodes.node_of)
    per = len(r.counts) // ep
    tok = _tokens_of_expert(r)

    def rows(s: int, j: int) -> list[Label]:
        return [(s, e, t) for e in range(j * per, (j + 1) * per) for t in tok[e]]

    def inside(p: int, q: int) -> list[Label]:
        if p == q or not nodes.same(p, q):
            return []
        return [x for s in range(ep) if nodes.deliverer(s, p) == q for x in rows(s, p)]

    def network(p: int, q: int) -> list[Label]:
        node = nodes.node_of[p]
        if nodes.same(p, q) or p != nodes.relay(q, node):
            return []
        return [x for j in nodes.members[node] for x in rows(q, j)]

    starts = [[x for s in range(ep) for x in rows(s, j)] for j in range(ep)]
    wanted = [x for j in range(ep) for x in rows(me, j)]
    return plan_hops(me, starts, [inside, network], wanted)
