"""`GraphBuilder`: records nodes and bidirectional links with dense ids, in a fixed order.

It keeps the links as flat lists in id order (ends, bandwidth, latency, kind: what `Cluster`
and the network model read) and builds the `networkx.DiGraph` only when asked (`graph()`),
replaying the very calls in their order, so the graph is the one an eager builder made: a
131,072-GPU cluster routes and simulates without its million-edge graph ever being built.
"""

from __future__ import annotations

import networkx as nx


class GraphBuilder:
    """Accumulates nodes and links; each directed link gets the next integer id."""

    def __init__(self) -> None:
        self.nodes: set[str] = set()
        self.ends: list[tuple[str, str]] = []
        """Directed link id -> (from node, to node)."""
        self.bandwidth: list[float] = []
        self.latency: list[float] = []
        self.kind: list[str] = []
        self._log: list[tuple[str, str, dict[str, object]] | int] = []
        """The calls in order: a node (name, kind, attributes) or a link (its first id)."""
        self._graph: nx.DiGraph | None = None

    def node(self, name: str, kind: str, **attrs: object) -> str:
        assert self._graph is None, "the graph is built: the builder is closed"
        self._log.append((name, kind, attrs))
        self.nodes.add(name)
        return name

    def link(self, a: str, b: str, *, bandwidth: float, latency: float, kind: str) -> None:
        """Two directed links a->b and b->a, each with `bandwidth` bytes/s per direction."""
        assert self._graph is None, "the graph is built: the builder is closed"
        self._log.append(len(self.ends))
        self.ends += [(a, b), (b, a)]
        self.bandwidth += [bandwidth, bandwidth]
        self.latency += [latency, latency]
        self.kind += [kind, kind]

    def graph(self) -> nx.DiGraph:
        """The `networkx.DiGraph` of every call so far, built once."""
        if self._graph is None:
            graph = nx.DiGraph()
            for entry in self._log:
                if isinstance(entry, int):
                    for i in (entry, entry + 1):
                        u, v = self.ends[i]
                        assert not graph.has_edge(u, v), f"duplicate link {u}->{v}"
                        graph.add_edge(u, v, bandwidth=self.bandwidth[i],
                                       latency=self.latency[i], kind=self.kind[i], id=i)
                else:
                    name, kind, attrs = entry
                    graph.add_node(name, kind=kind, **attrs)
            self._graph = graph
        return self._graph
