"""The folded copies' flows on the links a folded replay simulates.

A folded plan holds one rank per class; each of its communications stands for copies on
shifted groups (`traces.symmetry.copies`), whose flows load the links the representatives
use. `copy_flows` adds them. Two shortcuts keep 131,072-GPU folds in seconds, each giving
the very integers the copy-by-copy sum gives (counts of flows; the sum's order cannot
change an integer):

- a copy on one server whose links the representatives never use adds nothing, so it is
  not lowered (nearly all of a DP-1024 job's 16,384 TP groups);
- a transfer's copies are routed all at once by link arithmetic (`topology.links`), one
  array operation for a pipeline's 245,760 sends instead of one route each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sim.engine.flows import FlowSet, Lowering
from topology.cluster import Cluster
from topology.links import LinkIndex, link_counts, link_index

Group = tuple[int, ...]


class Used:
    """The links the representatives' flows cross (None: every link, as on hashed fabrics)."""

    def __init__(self, cluster: Cluster, links: set[int] | None) -> None:
        self.links = links
        self.index: LinkIndex | None = link_index(cluster)
        self.capacity = cluster.link_capacity
        self._mask: np.ndarray | None = None

    def mask(self) -> np.ndarray:
        """`mask[link]`: whether the link is used."""
        if self._mask is None:
            assert self.links is not None
            self._mask = np.zeros(len(self.capacity), dtype=bool)
            self._mask[np.fromiter(self.links, dtype=np.int64, count=len(self.links))] = True
        return self._mask


def local_shape(index: LinkIndex, group: Group) -> tuple[int, tuple[int, ...]] | None:
    """(server, members' local GPU indices in group order) of a group on one server; None
    if it spans several."""
    server = group[0] // index.gpus
    if any(r // index.gpus != server for r in group):
        return None
    return server, tuple(r % index.gpus for r in group)


def collective_copies(used: Used, group: Group, lowering: Lowering, images: list[Group],
                      lower: Callable[[Group], Lowering]) -> Lowering:
    """`lowering` with the flows of its copies on `images` that cross used links. The copy of
    a group on one server, with the same local GPUs on another (identical) server, has the
    same flows on that server's own links, shifted by whole servers (`topology.links`): a
    copy whose shifted links are all unused is skipped unlowered."""
    index, links = used.index, used.links
    if index is not None and links is not None and images:
        home = local_shape(index, group)
        flows = sorted({link for rnd in lowering for fs, _ in rnd for link in fs.links})
        step = index.per_server
        if home is not None and all(link // step == home[0] for link in flows if link >= 0):
            kept = []
            for image in images:
                shape = local_shape(index, image)
                if shape is None or shape[1] != home[1] or any(
                        link + (shape[0] - home[0]) * step in links for link in flows):
                    kept.append(image)
            images = kept
    return with_copies(lowering, [lower(g) for g in images], links, used.capacity)


def transfer_copies(used: Used, lowering: Lowering, pairs: list[tuple[int, int]],
                    lower: Callable[[int, int], Lowering]) -> Lowering:
    """A transfer's `lowering` (one flow) with its copies' flows on used links: routed as
    arrays where the cluster's ids follow `topology.links`, else copy by copy."""
    index = used.index
    if index is None or not pairs:
        return with_copies(lowering, [lower(a, b) for a, b in pairs], used.links,
                           used.capacity)
    ends = np.asarray(pairs, dtype=np.int64)
    rows = index.hop_links(ends[:, 0], ends[:, 1])
    flat = rows[rows >= 0]
    if used.links is not None:
        flat = flat[used.mask()[flat]]
    links, counts = link_counts(flat)
    ((flows, factor),), = lowering
    if not len(links):
        return lowering
    extra = dict(zip(links.tolist(), counts.tolist()))
    return (((merge(flows, extra, used.capacity), factor),),)


def with_copies(lowering: Lowering, copies: Sequence[Lowering], used: set[int] | None,
                capacity: tuple[float, ...]) -> Lowering:
    """`lowering` with each copy's flows that cross `used` links (None: every link) added to
    the matching flow set (copies have the same shape: the same algorithm on a shifted
    group). On a fabric whose routes are not shifts of each other (`symmetric` False: ECMP's
    hash, adaptive placement) every copy's flows are kept on its own links, so the set moves
    at the pace of the copy that hashing treats worst."""
    if not copies:
        return lowering
    rounds = []
    for k, rnd in enumerate(lowering):
        sets = []
        for j, (flows, factor) in enumerate(rnd):
            extra: dict[int, int] = {}
            for copy in copies:
                twin = copy[k][j][0]
                for link, count in zip(twin.links, twin.counts):
                    if used is None or link in used:
                        extra[link] = extra.get(link, 0) + count
            sets.append((merge(flows, extra, capacity), factor) if extra else (flows, factor))
        rounds.append(tuple(sets))
    return tuple(rounds)


def merge(flows: FlowSet, extra: dict[int, int], capacity: tuple[float, ...]) -> FlowSet:
    """`flows` with `extra[link]` more flows on each link."""
    counts = dict(zip(flows.links, flows.counts))
    for link, count in extra.items():
        counts[link] = counts.get(link, 0) + count
    return FlowSet.from_counts(counts, flows.latency_s, capacity, flows.qps)
