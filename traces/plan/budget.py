"""The plan builder's op budget: how many ops the ranks being lowered stand for so far.

The builder lowers one rank per pipeline coordinate first and spends, for each op it lowers,
the number of chosen ranks that rank stands for; the compute pass spends its ops before it
builds them, the later passes what they added. So the plan's size is counted by the passes
themselves, and a plan bigger than the limit is refused once that many ops are accounted for,
never after building them all.
"""

from __future__ import annotations


class OverBudget(Exception):
    """The budget is spent: the plan holds at least `spent` ops (the builder words the error)."""

    def __init__(self, spent: int) -> None:
        super().__init__(spent)
        self.spent = spent


class OpBudget:
    """Ops accounted for against `limit`; `weight` is how many ranks the rank being lowered
    stands for (each of its ops counts that many times)."""

    __slots__ = ("limit", "spent", "weight")

    def __init__(self, limit: int) -> None:
        self.limit, self.spent, self.weight = limit, 0, 1

    def spend(self, ops: int) -> None:
        """Account for `ops` more ops of the rank being lowered; raise OverBudget past the
        limit."""
        self.spent += ops * self.weight
        if self.spent > self.limit:
            raise OverBudget(self.spent)
