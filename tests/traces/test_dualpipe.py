"""DualPipe, deepseek-ai/DualPipe's two-copy bidirectional schedule (`traces.dualpipe_order`):
its order equals the repository's `DualPipe.step` (dualpipe/dualpipe.py, commit
bb214e82b5933d4cf4249eb76c27076428061c7c) re-enacted here step by step for pp 2, 4, 8; it runs
to the end with micro-batches entering at both ends; its bubble is the README's
(PP/2 - 1)(F&B + B - 3W) and its peak activations PP + 1 (README, "Pipeline Bubbles and
Memory Usage Comparison", commit 89f5de17a303cd342b64631e06ce401b36b6e1e0)."""

from __future__ import annotations

from collections import deque

import pytest

from sim.models.memory import peak_in_flight
from traces.dualpipe_order import dualpipe_order, first_stages, last_stages
from traces.moe_overlap import dualpipe_pairs
from traces.pipeline import Action
from traces.zero_bubble import idle_and_end, makespan

CASES = [(pp, m) for pp in (2, 4, 8) for m in (2 * pp, 2 * pp + 2, 4 * pp, 6 * pp + 4)]


class _Repo:
    """`DualPipe.step`'s compute calls for one rank, as the repository makes them: phase p
    is direction p ^ is_in_second_half; a backward with enable_zb defers its weight
    gradients to WeightGradStore's FIFO queue, `_weight_chunk` pops the oldest; an overlapped
    `_forward_backward_chunk` is its forward, then its (full) backward."""

    def __init__(self, rank: int, pp: int, m: int) -> None:
        self.rank, self.pp, self.m = rank, pp, m
        self.second = rank >= pp // 2
        self.f = [0, 0]  # current_f_chunk_id per direction
        self.b = [0, 0]
        self.queue: deque[str] = deque()
        self.out: list[str] = []

    def _name(self, direction: int, kind: str, chunk: int) -> str:
        stage = self.rank if direction == 0 else 2 * self.pp - 1 - self.rank
        return f"{stage}{kind}{chunk + direction * self.m // 2}"

    def forward(self, phase: int) -> None:
        d = phase ^ self.second
        self.out.append(self._name(d, "F", self.f[d]))
        self.f[d] += 1

    def backward(self, phase: int, enable_zb: bool = False) -> None:
        d = phase ^ self.second
        self.out.append(self._name(d, "B", self.b[d]))
        w = self._name(d, "W", self.b[d])
        self.b[d] += 1
        if enable_zb:
            self.queue.append(w)
        else:
            self.out.append(w)

    def weight(self) -> None:
        self.out.append(self.queue.popleft())

    def forward_backward(self, phase0: int, phase1: int) -> None:
        self.forward(phase0)
        self.backward(phase1)

    def step(self) -> list[str]:
        """Steps 1-8 of DualPipe.step, their counts as the repository computes them."""
        pp, half = self.pp, self.pp // 2
        h = min(self.rank, pp - 1 - self.rank)
        chunks = self.m // 2
        for _ in range((half - h - 1) * 2):  # step 1: nF0
            self.forward(0)
        for _ in range(h + 1):  # step 2: nF0F1
            self.forward(0)
            self.forward(1)
        for _ in range(half - h - 1):  # step 3: nB1W1F1
            self.backward(1, enable_zb=True)
            self.weight()
            self.forward(1)
        for _ in range(chunks - pp + h + 1):  # step 4: nF0B1F1B0
            self.forward_backward(0, 1)  # the middle ranks' first: F then B, not overlapped
            self.forward_backward(1, 0)
        for _ in range(half - h - 1):  # step 5: nB1F1B0
            self.backward(1)
            self.forward_backward(1, 0)
        enable_zb = False
        for i in range(h + 1):  # step 6: nB1B0
            if i == (h + 1) // 2 and h % 2 == 1:
                enable_zb = True
            self.backward(1, enable_zb)
            if i == (h + 1) // 2 and h % 2 == 0:
                enable_zb = True
            self.backward(0, enable_zb)
        for _ in range(half - h - 1):  # step 7: nWB0
            self.weight()
            self.backward(0, enable_zb=True)
        for _ in range(h + 1):  # step 8: nW
            self.weight()
        assert not self.queue
        return self.out


def _schedule(pp: int, m: int) -> dict[int, list[Action]]:
    return {r: [Action(*s) for s in steps] for r, steps in dualpipe_order(pp, m).items()}


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_dualpipe_is_the_repositorys_order(pp: int, m: int) -> None:
    mine = {r: [f"{s}{k}{i}" for s, k, i in steps] for r, steps in dualpipe_order(pp, m).items()}
    assert mine == {r: _Repo(r, pp, m).step() for r in range(pp)}


def test_the_order_at_pp_4_and_8_micro_batches() -> None:
    """Written out: rank 0 feeds direction 0 (micro-batches 0-3, stage 0) and ends direction
    1 (4-7, stage 7, the loss)."""
    assert " ".join(map(str, _schedule(4, 8)[0])) == (
        "0F0 0F1 0F2 7F4 7B4 7W4 7F5 0F3 7B5 7W5 7F6 0B0 0W0 7B6 7W6 7F7 0B1 0W1 7B7 7W7 "
        "0B2 0W2 0B3 0W3")


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_each_rank_runs_both_copies_once_per_micro_batch_and_ends(pp: int, m: int) -> None:
    """Rank r: stage r (direction 0, micro-batches 0 .. m/2 - 1) and stage 2 pp - 1 - r
    (direction 1, m/2 .. m - 1), each F, B and W once; the whole runs without deadlock."""
    schedule = _schedule(pp, m)
    for r, actions in schedule.items():
        expected = {Action(s, k, i + d * m // 2) for d, s in enumerate((r, 2 * pp - 1 - r))
                    for k in ("F", "B", "W") for i in range(m // 2)}
        assert sorted(map(str, actions)) == sorted(map(str, expected))
    ends = (first_stages(pp), last_stages(pp))
    assert makespan(schedule, {"F": 1.0, "B": 1.0, "W": 1.0}, ends) > 0


@pytest.mark.parametrize("pp", [4, 6, 8])
@pytest.mark.parametrize("ratio", [2.5, 2.75, 3.0])
@pytest.mark.parametrize("t", [1.0, 0.37])
def test_bubble_is_the_readmes(pp: int, ratio: float, t: float) -> None:
    """With F = B = W = t (a full backward 2t, the README figure's equal cells) and an
    overlapped pair F&B = ratio * t (3t: no overlap), the most idle rank waits
    (PP/2 - 1)(F&B + B - 3W) = (PP/2 - 1)(ratio - 1) t, B the full backward."""
    m = 2 * pp + 2 * (pp % 4 == 2)
    schedule = _schedule(pp, m)
    groups = {r: dualpipe_pairs(actions) for r, actions in schedule.items()}
    times = {"F": t, "B": t, "W": t, "FB": ratio * t}
    busy, end = idle_and_end(schedule, times, (first_stages(pp), last_stages(pp)), groups)
    bubble = max(max(end.values()) - b for b in busy.values())
    assert bubble == pytest.approx((pp / 2 - 1) * (ratio * t + 2 * t - 3 * t), rel=1e-12)


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_peak_activations_are_pp_plus_one(pp: int, m: int) -> None:
    """Chunk passes held at once (a chunk is a whole stage here: L/pp layers): PP + 1 on
    every rank, the README's, against 1F1B's PP on its first rank."""
    assert [peak_in_flight(actions) for actions in _schedule(pp, m).values()] == [pp + 1] * pp
