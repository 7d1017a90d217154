"""Process groups from the rank layout, one communicator per (stream, member ranks).

Collectives on one communicator are matched by issue order across its members. The plan puts
ops that share a group on different streams (the DP group serves `dp`, `zero_ag` and
`zero_rs`), and ops on different streams may be in flight at once, so each (stream, group)
pair gets a communicator of its own: calls on one communicator then come from one stream, in
plan order, and are never raced. Every rank creates every group (torch.distributed requires it)
in one sorted order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta

import torch.distributed as dist

from traces.errors import ConfigError
from traces.expert_grid import ep_group, expert_grad_group
from traces.layout import Axis, Layout
from traces.ops import Stream, Trace
from traces.plan.optimizer import grad_stats_group

GroupKey = tuple[str, tuple[int, ...]]
"""(stream, member ranks in communicator order)."""

# Which streams a plan issues each layout group's collectives on (docs/plan-ops.md).
STREAMS_BY_AXIS: Mapping[str, tuple[str, ...]] = {
    "tp": (Stream.COMPUTE, Stream.DP, Stream.ZERO_RS),  # sp_grads ride with the reductions
    "dp": (Stream.DP, Stream.ZERO_AG, Stream.ZERO_RS),
    "embedding": (Stream.DP,),
    "cp": (Stream.COMPUTE,),  # all_gather CP's K/V gathers and dK/dV reduce-scatters
    "grad_stats": (Stream.COMPUTE,),  # the step's end: found-inf and the norm
    "ep": (Stream.COMPUTE, Stream.EP_COMM),  # MoE's dispatch and combine all-to-alls
    "expert_dp": (Stream.DP,),  # MoE's expert gradients
}


def layout_groups(layout: Layout, experts: bool = False) -> dict[str, list[tuple[int, ...]]]:
    """The groups collectives may use, by axis: TP, DP (DP x CP under context parallelism),
    CP, the tied-embedding pairs, the ranks the gradient statistics are reduced over
    (`grad_stats_group`), and with `experts` (an MoE model) the EP and expert-DP groups
    (`traces.expert_grid`)."""
    embedding = sorted({layout.embedding_group(r) for r in range(layout.world)}) \
        if layout.pp > 1 else []
    data = sorted({layout.data_group(r) for r in range(layout.world)})
    stats = sorted({grad_stats_group(layout, r) for r in range(layout.world)})
    ranks = range(layout.world) if experts else range(0)
    return {"tp": layout.groups(Axis.TP), "dp": data, "embedding": embedding,
            "cp": layout.groups(Axis.CP) if layout.cp > 1 else [], "grad_stats": stats,
            "ep": sorted({ep_group(layout, r) for r in ranks}),
            "expert_dp": sorted({expert_grad_group(layout, r) for r in ranks})}


def layout_group_keys(layout: Layout,
                      streams: Mapping[str, Iterable[str]] = STREAMS_BY_AXIS) -> list[GroupKey]:
    """Every (stream, group) the layout's plans can use, groups of one rank left out."""
    keys = {(str(stream), group) for axis, groups in layout_groups(layout).items()
            for group in groups if len(group) > 1 for stream in streams[axis]}
    return sorted(keys)


def plan_group_keys(plan: Trace, layout: Layout) -> list[GroupKey]:
    """The (stream, group) pairs the plan's collectives use, checked against the layout; a
    group the layout does not define is a ConfigError before anything runs."""
    if len(plan.ops) != layout.world:
        raise ConfigError(f"plan: holds {len(plan.ops)} ranks but the layout has {layout.world} "
                          "(a folded plan cannot be executed; build it for every rank)")
    experts = bool(getattr(plan.meta.model, "experts", 0))
    known = {g for groups in layout_groups(layout, experts).values() for g in groups}
    keys = set()
    for rank, ops in plan.ops.items():
        for index, op in enumerate(ops):
            if not op.kind.is_collective:
                continue
            if op.group not in known or rank not in op.group:
                raise ConfigError(f"plan: rank {rank} op {index} ({op.name or op.kind}): group "
                                  f"{list(op.group)} is not a TP, CP, DP, embedding, gradient "
                                  "statistics, EP or expert-DP group of this rank in the "
                                  "layout")
            keys.add((op.stream, op.group))
    return sorted(keys)


class Groups:
    """Communicators by (stream, ranks) for one rank: `get` returns this rank's process group
    for a key it belongs to. `None` stands for a group of one rank (nothing to communicate)."""

    def __init__(self, rank: int, table: Mapping[GroupKey, dist.ProcessGroup]) -> None:
        self.rank = rank
        self._table = dict(table)

    @classmethod
    def create(cls, keys: Iterable[GroupKey], timeout_s: float) -> Groups:
        """Create a communicator for every key, on every rank, in sorted order (collective:
        all ranks must call this with the same keys)."""
        rank = dist.get_rank()
        table = {}
        for key in sorted(set(keys)):
            stream, ranks = key
            assert list(ranks) == sorted(ranks), f"group {ranks} is not in ascending order"
            group = dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))
            if rank in ranks:
                table[key] = group
        return cls(rank, table)

    def get(self, key: GroupKey) -> dist.ProcessGroup | None:
        if len(key[1]) == 1:
            return None
        try:
            return self._table[key]
        except KeyError:
            raise RuntimeError(f"rank {self.rank} has no communicator for stream {key[0]!r}, "
                               f"group {list(key[1])}") from None

    def keys(self) -> list[GroupKey]:
        return sorted(self._table)

    def destroy(self) -> None:
        for group in self._table.values():
            dist.destroy_process_group(group)
        self._table.clear()
