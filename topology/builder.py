"""`GraphBuilder`: adds nodes and bidirectional links with dense ids, in a fixed order."""

from __future__ import annotations

import networkx as nx


class GraphBuilder:
    """Accumulates a `networkx.DiGraph`; each directed link gets the next integer id."""

    def __init__(self) -> None:
        self.graph = nx.DiGraph()
        self._next_id = 0

    def node(self, name: str, kind: str, **attrs: object) -> str:
        self.graph.add_node(name, kind=kind, **attrs)
        return name

    def link(self, a: str, b: str, *, bandwidth: float, latency: float, kind: str) -> None:
        """Two directed links a->b and b->a, each with `bandwidth` bytes/s per direction."""
        for u, v in ((a, b), (b, a)):
            assert not self.graph.has_edge(u, v), f"duplicate link {u}->{v}"
            self.graph.add_edge(u, v, bandwidth=bandwidth, latency=latency, kind=kind,
                                id=self._next_id)
            self._next_id += 1
