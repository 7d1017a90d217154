"""Per-dimension bidirectional rings on a torus, all dimensions busy at once.

The group must be a grid: the product of one set of coordinates per torus axis. With D axes of
more than one member, the data is cut into D chunks; chunk i reduce-scatters along its axes in
the rotated order i, i+1, ... so that in every round each axis carries one chunk. Along an axis,
every line of members runs a ring in both directions, each direction with half the chunk.
All-gather retraces the rounds backwards; all-reduce is the two. Only neighbour links carry
traffic when the lines span their whole axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from sim.collectives.base import AG, AR, RS, Lowering, cycle_latency, flowset, hop
from sim.engine.flows import FlowSet
from topology.cluster import Cluster
from topology.torus import Torus
from traces.ops import OpKind


def grid_axes(torus: Torus, group: Sequence[int]) -> list[list[int]] | None:
    """Sorted coordinate values per axis if `group` is a full grid, else None."""
    coords = [torus.coord(r) for r in group]
    values = [sorted({c[a] for c in coords}) for a in range(len(torus.dims))]
    if len(set(coords)) != len(coords) or len(coords) != prod(len(v) for v in values):
        return None
    return values


def _lines(torus: Torus, group: Sequence[int], axis: int) -> list[list[int]]:
    """Members grouped into lines along `axis`, each sorted by its coordinate on the axis."""
    lines: dict[tuple[int, ...], list[int]] = {}
    for r in sorted(group, key=lambda r: torus.coord(r)[axis]):
        c = torus.coord(r)
        lines.setdefault(c[:axis] + c[axis + 1:], []).append(r)
    return list(lines.values())


def _axis_flows(cluster: Cluster, torus: Torus, group: Sequence[int], axis: int) -> FlowSet:
    routes, latency = [], 0.0
    for line in _lines(torus, group, axis):
        for ring in (line, line[::-1]):
            hops = [hop(cluster, ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]
            routes += hops
            latency = max(latency, cycle_latency(cluster, hops))
    return flowset(cluster, routes, latency)


def lower_torus(cluster: Cluster, kind: OpKind, group: Sequence[int],
                channels: int | None = None) -> Lowering | None:
    torus = cluster.fabric
    if kind not in (AR, RS, AG) or not isinstance(torus, Torus):
        return None
    values = grid_axes(torus, group)
    if values is None:
        return None
    axes = [a for a, v in enumerate(values) if len(v) > 1]
    if not axes:
        return None
    flows = {a: _axis_flows(cluster, torus, group, a) for a in axes}
    d = len(axes)
    rounds = []  # reduce-scatter rounds; in round s, chunk i works on axis axes[(i + s) % d]
    for s in range(d):
        rnd = []
        for i in range(d):
            order = [axes[(i + t) % d] for t in range(s + 1)]
            held = 1 / d / prod(len(values[a]) for a in order[:-1])  # chunk data before round s
            m = len(values[order[-1]])
            rnd.append((flows[order[-1]], (m - 1) / m * held / 2))
        rounds.append(tuple(rnd))
    if kind is RS:
        return tuple(rounds)
    if kind is AG:
        return tuple(rounds[::-1])
    return tuple(rounds + rounds[::-1])
