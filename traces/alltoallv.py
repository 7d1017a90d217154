"""All-to-all-v: an all-to-all whose bytes per (source, destination) differ, in a compact form.

MoE routing gives every all-to-all one of two shapes (`traces.plan.experts`): in a dispatch
every EP rank routes its tokens alike, so member i sends member j the same `sizes[j]` bytes
whatever i is (rows equal, `by_sender` false: sizes are per receiver); in the combine the
tokens come back, the transpose: member i sends `sizes[i]` to every member (`by_sender` true).
So n numbers describe the n x n matrix (MPI's MPI_Alltoallv and torch's
`all_to_all_single(output_split_sizes, input_split_sizes)` take a row and a column of it):

    matrix[i][j]   bytes member i (group order) sends member j, the diagonal staying local
    send_splits(i) row i: what member i sends each member (torch's input_split_sizes)
    recv_splits(j) column j: what member j receives from each (output_split_sizes)

The op's `size_bytes` stays nccl-tests' per-rank buffer: the matrix's total over n, the same
for every member (so every member's op has one key). `Op.split` is None for an even
all-to-all, and a trace file names a split only where it is uneven, so even traces keep their
bytes. `from_json` checks a file's split; `check_split` its agreement with the op. A DeepEP
dispatch's split (`deepep_split`) also carries its routing (`traces.deepep`), even balanced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from traces import deepep
from traces.moe_groups import RoutingSpec


@dataclass(frozen=True, slots=True)
class AllToAllv:
    """Per-peer sizes of an uneven all-to-all (module docstring): `sizes[k]` bytes to member
    k from every member (`by_sender` false), or from member k to every member (true)."""

    sizes: tuple[float, ...]
    by_sender: bool = False
    deepep: deepep.DeepEp | None = None
    """Set for a DeepEP dispatch or combine (`traces.deepep`): the routing its flows follow."""

    @property
    def num_ranks(self) -> int:
        return len(self.sizes)

    def bytes(self, i: int, j: int) -> float:
        """matrix[i][j]: bytes member i sends member j."""
        return self.sizes[i if self.by_sender else j]

    def matrix(self) -> list[list[float]]:
        n = self.num_ranks
        return [[self.bytes(i, j) for j in range(n)] for i in range(n)]

    def send_splits(self, i: int) -> tuple[float, ...]:
        return tuple(self.bytes(i, j) for j in range(self.num_ranks))

    def recv_splits(self, j: int) -> tuple[float, ...]:
        return tuple(self.bytes(i, j) for i in range(self.num_ranks))

    @property
    def mean_send_bytes(self) -> float:
        """The matrix's total over n: Σ sizes either way (the op's `size_bytes`)."""
        return math.fsum(self.sizes)

    def transpose(self) -> AllToAllv:
        """The exchange back (a dispatch's combine): matrix[j][i]."""
        return AllToAllv(self.sizes, not self.by_sender, self.deepep)

    def classes(self) -> list[tuple[float, tuple[int, ...]]]:
        """(bytes, members) per distinct non-zero size, ascending: the members that receive
        (by_sender false) or send (true) that many bytes per peer."""
        members: dict[float, list[int]] = {}
        for k, size in enumerate(self.sizes):
            if size > 0:
                members.setdefault(size, []).append(k)
        return [(size, tuple(members[size])) for size in sorted(members)]


def split_of(sizes: list[float] | tuple[float, ...], *, by_sender: bool) -> AllToAllv | None:
    """The split of these per-peer sizes, or None where they are all equal (a plain,
    even all-to-all)."""
    sizes = tuple(float(s) for s in sizes)
    return AllToAllv(sizes, by_sender) if len(set(sizes)) > 1 else None


def deepep_split(model: RoutingSpec, counts: Sequence[int], tokens: int, row: float,
                 sizes: Sequence[float]) -> AllToAllv:
    """A DeepEP dispatch's op split: the NCCL per-receiver `sizes` (the rank's buffer stays
    theirs) and the routing (`counts` pairs per expert of `tokens`) its flows follow."""
    d = deepep.DeepEp(model.experts, model.top_k, model.router_groups,
                      model.router_group_topk, tokens, float(row), tuple(counts),
                      dispatch=model.dispatch)
    return AllToAllv(tuple(float(s) for s in sizes), False, d)


def to_json(split: AllToAllv) -> dict[str, Any]:
    out = {"sizes": list(split.sizes), "by_sender": split.by_sender}
    return out if split.deepep is None else {**out, "deepep": deepep.to_json(split.deepep)}


def from_json(value: object) -> AllToAllv:
    """A file's split, or ValueError with the rule (the reader adds file, rank and op)."""
    if type(value) is not dict or set(value) - {"deepep"} != {"sizes", "by_sender"}:
        raise ValueError("must be an object with exactly 'sizes' (bytes per member) and "
                         "'by_sender' (true: per sender, false: per receiver), and optionally "
                         "'deepep'")
    sizes, by_sender = value["sizes"], value["by_sender"]
    if type(by_sender) is not bool:
        raise ValueError(f"'by_sender' must be true or false, got {by_sender!r}")
    if type(sizes) is not list or len(sizes) < 2 or \
            not all(type(s) in (int, float) and math.isfinite(s) and s >= 0 for s in sizes):
        raise ValueError("'sizes' must list two or more finite byte counts >= 0, one per "
                         "member of the group")
    if "deepep" in value:
        return AllToAllv(tuple(float(s) for s in sizes), by_sender,
                         deepep.from_json(value["deepep"]))
    split = split_of(sizes, by_sender=by_sender)
    if split is None:
        raise ValueError("'sizes' are all equal: an even all-to-all has no split")
    return split


def check_split(split: AllToAllv, kind: str, group: tuple[int, ...], size_bytes: float) -> None:
    """A split agrees with its op: an all-to-all, one size per group member, adding up to
    the op's per-rank buffer; ValueError with the rule otherwise."""
    if kind != "all_to_all":
        raise ValueError(f"only an all_to_all has a split, not a {kind}")
    if split.num_ranks != len(group):
        raise ValueError(f"has {split.num_ranks} sizes for a group of {len(group)} ranks "
                         f"(one per member)")
    if not math.isclose(split.mean_send_bytes, size_bytes, rel_tol=1e-9):
        raise ValueError(f"sizes add up to {split.mean_send_bytes:g} bytes, not the op's "
                         f"size_bytes {size_bytes:g} (a rank's buffer: the matrix's total / n)")
