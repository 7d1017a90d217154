"""Expert parallelism on Megatron-Core's parallel folding: the experts' own grid of ranks.

Attention keeps its TP·CP·DP grid; the experts fold over the same n = TP·CP·DP ranks of each
pipeline stage in a grid of their own, ordered ETP fastest, then EP, then expert-DP
(Megatron-Core's RankGenerator with order "tp-ep-dp-pp" and tp = etp). A rank's index in its
stage, i = tp + TP·(cp + CP·dp), gives

    etp coordinate  i mod ETP
    ep coordinate   (i div ETP) mod EP
    edp coordinate  i div (ETP·EP)            over n / (ETP·EP) expert-data-parallel ranks

so ETP·EP must divide n, and at ETP 1 an EP group is EP consecutive ranks (at TP 2, EP 64 spans
8 nodes of 8 GPUs, not 16). Expert gradients are reduced over the expert-DP group, dense ones
over the whole DP (x CP) group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from traces.errors import ConfigError
from traces.fields import MAX_ACCELERATORS, check_int
from traces.model import ModelSpec
from traces.schedule_rules import model_copies


class Layout(Protocol):
    """The degrees of `traces.layout.Layout` the grid reads (it imports this module)."""

    @property
    def tp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def etp(self) -> int: ...
    @property
    def sp(self) -> bool: ...
    @property
    def zero(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def schedule(self) -> str: ...


def check_expert_grid(layout: Layout) -> None:
    """ep and etp are positive and ETP·EP divides each stage's TP·CP·DP ranks."""
    for name in ("ep", "etp"):
        check_int(getattr(layout, name), f"parallel.{name}", minimum=1,
                  maximum=MAX_ACCELERATORS)
    n = layout.tp * layout.cp * layout.dp
    if n % (layout.ep * layout.etp):
        raise ConfigError(f"parallel.ep: etp {layout.etp} x ep {layout.ep} = "
                          f"{layout.etp * layout.ep} does not divide tp x cp x dp = {n}, the "
                          "ranks of a stage the experts fold over")


def check_experts(model: ModelSpec, layout: Layout) -> None:
    """The rules that tie the expert grid to the model."""
    if not model.experts:
        if layout.ep > 1 or layout.etp > 1:
            raise ConfigError(f"parallel.ep: ep {layout.ep}, etp {layout.etp} need "
                              "model.experts > 0")
        return
    if model.experts % layout.ep:
        raise ConfigError(f"parallel.ep: {layout.ep} does not divide model.experts = "
                          f"{model.experts}")
    if model.moe_ffn_hidden % layout.etp:
        raise ConfigError(f"parallel.etp: {layout.etp} does not divide model.moe_ffn_hidden "
                          f"= {model.moe_ffn_hidden}")
    shared = model.shared_experts * model.moe_ffn_hidden  # one MLP that TP splits
    if shared % layout.tp:
        raise ConfigError(f"parallel.tp: {layout.tp} does not divide the shared experts' "
                          f"width, model.shared_experts x model.moe_ffn_hidden = {shared}")
    if layout.tp > 1 and not layout.sp:
        raise ConfigError(f"parallel.sp: an MoE model at tp {layout.tp} needs sp = true "
                          "(Megatron-Core requires sequence parallelism with MoE and TP)")


def stage_index(layout: Layout, rank: int) -> int:
    """The rank's index among its stage's TP·CP·DP ranks."""
    return rank % (layout.tp * layout.cp * layout.dp)


def ep_coord(layout: Layout, rank: int) -> int:
    return (stage_index(layout, rank) // layout.etp) % layout.ep


def _members(layout: Layout, rank: int, stride: int, count: int) -> tuple[int, ...]:
    """The `count` ranks of the stage that differ from `rank` only in the coordinate whose
    step in the stage index is `stride`."""
    i = stage_index(layout, rank)
    base = rank - i
    coord = (i // stride) % count
    first = i - coord * stride
    return tuple(base + first + k * stride for k in range(count))


def ep_group(layout: Layout, rank: int) -> tuple[int, ...]:
    """The EP group: the all-to-alls' members, in EP order."""
    return _members(layout, rank, layout.etp, layout.ep)


def etp_group(layout: Layout, rank: int) -> tuple[int, ...]:
    return _members(layout, rank, 1, layout.etp)


def expert_data_degree(layout: Layout) -> int:
    """Ranks that hold the same experts: TP·CP·DP / (ETP·EP)."""
    return layout.tp * layout.cp * layout.dp // (layout.etp * layout.ep)


def expert_data_group(layout: Layout, rank: int) -> tuple[int, ...]:
    return _members(layout, rank, layout.etp * layout.ep, expert_data_degree(layout))


def expert_grad_degree(layout: Layout) -> int:
    """Ranks that sum a routed expert's gradient and shard its ZeRO states: its expert-DP
    group, on both ranks of a DualPipe pair (`traces.schedule_rules.holders`)."""
    return expert_data_degree(layout) * model_copies(str(layout.schedule))


def expert_grad_group(layout: Layout, rank: int) -> tuple[int, ...]:
    """The `expert_grad_degree` ranks of `rank`'s experts, in rank order (its expert-DP
    group but under dualpipe, where the pair's mirror stage's group joins it)."""
    group = expert_data_group(layout, rank)
    if model_copies(str(layout.schedule)) == 1:
        return group
    n = layout.tp * layout.cp * layout.dp
    pp_rank = rank // n
    mirror = (layout.pp - 1 - pp_rank - pp_rank) * n
    return tuple(sorted((*group, *(r + mirror for r in group))))


GroupOf = Callable[[Layout, int], tuple[int, ...]]
"""A kind of expert group: the group of that kind a rank belongs to."""


def grid_kinds(layout: Layout) -> list[GroupOf]:
    """The kinds of expert group with more than one rank (EP, ETP, expert-DP), in that order;
    none when the layout has no expert grid (ep = etp = 1)."""
    if layout.ep * layout.etp == 1:
        return []
    kinds = [(ep_group, layout.ep), (etp_group, layout.etp),
             (expert_data_group, expert_data_degree(layout))]
    return [kind for kind, size in kinds if size > 1]


def kind_of(layout: Layout, group: tuple[int, ...]) -> GroupOf | None:
    """The kind of expert group `group` is (as the plan writes it, in grid order), if any."""
    for kind in grid_kinds(layout):
        if kind(layout, group[0]) == group:
            return kind
    return None


def stage_groups(layout: Layout, kind: GroupOf, rank: int) -> list[tuple[int, ...]]:
    """Every group of `kind` in `rank`'s pipeline stage, by least member."""
    base = rank - stage_index(layout, rank)
    key = (layout.tp, layout.cp, layout.dp, layout.ep, layout.etp, kind)
    found = _STAGE_GROUPS.get(key)
    if found is None:
        n = layout.tp * layout.cp * layout.dp
        found = _STAGE_GROUPS[key] = tuple(g for r in range(n) if (g := kind(layout, r))[0] == r)
    return [tuple(base + i for i in group) for group in found]


_STAGE_GROUPS: dict[tuple[object, ...], tuple[tuple[int, ...], ...]] = {}
"""Stage 0's groups per grid and kind (every stage's are these, moved by its first rank)."""


def shift_closed(layout: Layout) -> bool:
    """Whether every tp and dp shift (`traces.symmetry`'s) maps each expert group onto a group
    of its kind. Then one rank per (cp, pp) stands for its stage exactly; otherwise (TP 1, DP 4,
    EP 2: the dp shift by one maps EP group [0, 1] onto [1, 2], no group) a fold must match
    expert groups by their members' classes (`traces.symmetry.copies` with classes). Checked
    on the two generating shifts, O(TP·CP·DP · group size) once per kind."""
    num_tp, num_cp, num_dp = layout.tp, layout.cp, layout.dp
    n = num_tp * num_cp * num_dp

    def tp_shift(i: int) -> int:
        return i - i % num_tp + (i % num_tp + 1) % num_tp

    def dp_shift(i: int) -> int:
        return (i + num_tp * num_cp) % n

    for kind in grid_kinds(layout):
        for shift in (tp_shift, dp_shift):
            for i in range(n):
                if {shift(m) for m in kind(layout, i)} != set(kind(layout, shift(i))):
                    return False
    return True
