"""Chips on a 2D or 3D torus: links to neighbours only, with wrap-around.

Chip index = x + X·(y + Y·z) (x varies fastest). Routing is dimension-order (x, then y, then z),
each dimension the short way round; a tie goes the positive way.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from topology.builder import GraphBuilder
from traces.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class TorusSpec:
    dims: tuple[int, ...]
    link_Bps: float
    """Bandwidth of one neighbour link, per direction."""
    link_latency_s: float


def chip_node(coord: tuple[int, ...]) -> str:
    return "chip" + ".".join(str(c) for c in coord)


class Torus:
    kind = "torus"

    def __init__(self, spec: TorusSpec) -> None:
        if len(spec.dims) not in (2, 3):
            raise ConfigError(f"cluster.dims: {list(spec.dims)} must have 2 or 3 dimensions")
        for d in spec.dims:
            if not isinstance(d, int) or d < 2:
                raise ConfigError(f"cluster.dims: {list(spec.dims)} has a dimension < 2; "
                                  "each torus dimension needs at least 2 chips")
        self.spec = spec
        self.dims = spec.dims

    @property
    def num_chips(self) -> int:
        return prod(self.dims)

    def coord(self, index: int) -> tuple[int, ...]:
        out = []
        for d in self.dims:
            index, c = divmod(index, d)
            out.append(c)
        return tuple(out)

    def index(self, coord: tuple[int, ...]) -> int:
        index = 0
        for c, d in zip(reversed(coord), reversed(self.dims)):
            index = index * d + c
        return index

    def build(self, builder: GraphBuilder) -> list[str]:
        chips = [self.coord(i) for i in range(self.num_chips)]
        names = [builder.node(chip_node(c), "chip", coord=c) for c in chips]
        for c in chips:
            for axis, size in enumerate(self.dims):
                nxt = list(c)
                nxt[axis] = (c[axis] + 1) % size
                if size == 2 and c[axis] == 1:
                    continue  # with two chips the + and - neighbour are one link
                builder.link(chip_node(c), chip_node(tuple(nxt)), bandwidth=self.spec.link_Bps,
                             latency=self.spec.link_latency_s, kind="ici")
        return names

    def path(self, src: int, dst: int, nic: int | None, qp: int = 0) -> list[str]:
        cur, target = list(self.coord(src)), self.coord(dst)
        nodes = [chip_node(tuple(cur))]
        for axis, size in enumerate(self.dims):
            forward = (target[axis] - cur[axis]) % size
            step = 1 if forward <= size - forward else -1
            while cur[axis] != target[axis]:
                cur[axis] = (cur[axis] + step) % size
                nodes.append(chip_node(tuple(cur)))
        return nodes
