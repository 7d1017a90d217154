"""DualPipeV's order as PyTorch's ScheduleDualPipeV makes it (torch/distributed/pipelining/
schedules.py, `_calculate_single_rank_operations`, torch 2.13.0, git
cf30153c4c131c8164ee7798e5022d810682e2cb; after deepseek-ai/DualPipe's V-shaped cut): two
chunks per rank in a V, rank r running stages r (chunk 0) and 2 pp - 1 - r (chunk 1), at
least 2 pp micro-batches.

PyTorch's order mixes three kinds of backward: a full backward (input and weight gradients
at once), a split one (B now, its W queued and run later, oldest first) and OVERLAP_F_B, a
forward of one chunk and a full backward of the other run side by side. Here a full backward
is its B followed at once by its W, and an overlapped pair is its F followed by its B and W:
the simulator runs the pair's two halves one after the other, so the overlap of one
micro-batch's communication with the other's compute is not modelled yet (nor is the
un-overlapped first pair of the last rank told apart from the others).

Rank r of pp with m micro-batches: 2(pp - r - 1) chunk-0 forwards; r + 1 pairs of forwards
(chunk 0, chunk 1); pp - r - 1 times a split chunk-1 B, the oldest queued W, a chunk-1 F;
m - 2 pp + r + 1 times two overlapped pairs (chunk-0 F with chunk-1 backward, chunk-1 F with
chunk-0 backward); pp - r - 1 times a chunk-1 full backward and an overlapped pair (chunk-1
F, chunk-0 backward); r + 1 times a chunk-1 then a chunk-0 backward, split from the middle
one on (the chunk-1 one included on odd ranks); pp - r - 1 times the oldest queued W and a
split chunk-0 B; then the queued W's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traces.zero_bubble_order import Kind, Step


@dataclass
class _Rank:
    """One rank's steps as they are made: per-(stage, kind) micro-batch counters and the
    split B's whose W has not run yet."""

    stages: tuple[int, int]
    steps: list[Step] = field(default_factory=list)
    count: dict[tuple[int, Kind], int] = field(default_factory=dict)
    queued: list[tuple[int, int]] = field(default_factory=list)

    def run(self, kind: Kind, chunk: int) -> int:
        """The chunk's next micro-batch of `kind`; returns that micro-batch."""
        stage = self.stages[chunk]
        mb = self.count.get((stage, kind), 0)
        self.count[(stage, kind)] = mb + 1
        self.steps.append((stage, kind, mb))
        return mb

    def backward(self, chunk: int, split: bool) -> None:
        """A B; its W at once (a full backward) or queued (split)."""
        mb = self.run("B", chunk)
        if split:
            self.queued.append((self.stages[chunk], mb))
        else:
            self.run("W", chunk)

    def oldest_w(self) -> None:
        """The W of the oldest split B not yet weighed, if any."""
        if self.queued:
            stage, mb = self.queued.pop(0)
            self.count[(stage, "W")] = self.count.get((stage, "W"), 0) + 1
            self.steps.append((stage, "W", mb))

    def pair(self, forward_chunk: int) -> None:
        """An overlapped pair: a forward of one chunk, a full backward of the other."""
        self.run("F", forward_chunk)
        self.backward(1 - forward_chunk, split=False)


def dualpipev_order(pp: int, m: int) -> dict[int, list[Step]]:
    """Per rank, its (stage, kind, micro-batch) steps in DualPipeV's order (the module
    docstring); m >= 2 pp."""
    assert m >= 2 * pp, "dualpipev needs at least 2 pp micro-batches"
    return {r: _rank_steps(r, pp, m) for r in range(pp)}


def _rank_steps(r: int, pp: int, m: int) -> list[Step]:
    rank = _Rank((r, 2 * pp - 1 - r))
    rest = pp - r - 1  # ranks after this one
    for _ in range(2 * rest):
        rank.run("F", 0)
    for _ in range(r + 1):
        rank.run("F", 0)
        rank.run("F", 1)
    for _ in range(rest):
        rank.backward(1, split=True)
        rank.oldest_w()
        rank.run("F", 1)
    for _ in range(m - 2 * pp + r + 1):
        rank.pair(0)
        rank.pair(1)
    for _ in range(rest):
        rank.backward(1, split=False)
        rank.pair(1)
    split = False
    for i in range(r + 1):
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        rank.backward(1, split)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        rank.backward(0, split)
    for _ in range(rest):
        rank.oldest_w()
        rank.backward(0, split)
    for _ in range(r + 1):
        rank.oldest_w()
    return rank.steps
