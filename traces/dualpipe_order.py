"""DualPipe's order, deepseek-ai/DualPipe's original two-copy schedule (dualpipe/dualpipe.py,
`DualPipe.step`, commit bb214e82b5933d4cf4249eb76c27076428061c7c; DeepSeek-V3 technical report,
arXiv 2412.19437, section 3.2.1): every rank holds two copies' chunks, micro-batches enter
from both ends, half at rank 0 (direction 0, through ranks 0 .. pp - 1) and half at rank
pp - 1 (direction 1, through ranks pp - 1 .. 0); pp even, m even, m >= 2 pp (the repo's
asserts).

Stages here: direction 0's position s is stage s on rank s; direction 1's position s is stage
pp + s on rank pp - 1 - s, so rank r runs stages r and 2 pp - 1 - r (the V's placement,
`traces.schedule_rules`), but a micro-batch crosses only its direction's pp stages (stage
pp - 1 ends direction 0, stage pp starts direction 1). Direction 0's micro-batches are
0 .. m/2 - 1, direction 1's m/2 .. m - 1.

The repo names a rank's chunks by phase: phase 0 is direction 0 on the first half of the
ranks, direction 1 on the second half (phase ^= is_in_second_half). Rank r and rank
pp - 1 - r (half_rank h = min(r, pp - 1 - r)) run the same steps in phases, and those are
DualPipeV's for rank h of pp/2 ranks and m/2 micro-batches (`traces.dualpipev_order`: same
eight steps, same counts, the same zero-bubble split B's), chunk c being phase c. The
middle ranks' first pair, not overlapped in the repo, is `traces.moe_overlap`'s to tell.
"""

from __future__ import annotations

from traces.dualpipev_order import dualpipev_order
from traces.zero_bubble_order import Step


def dualpipe_order(pp: int, m: int) -> dict[int, list[Step]]:
    """Per rank, its (stage, kind, micro-batch) steps in DualPipe's order (the module
    docstring); pp and m even, m >= 2 pp."""
    assert pp % 2 == 0 and m % 2 == 0 and m >= 2 * pp, "dualpipe needs pp, m even, m >= 2 pp"
    half = dualpipev_order(pp // 2, m // 2)
    return {r: _placed(r, pp, m, half[min(r, pp - 1 - r)]) for r in range(pp)}


def _placed(r: int, pp: int, m: int, steps: list[Step]) -> list[Step]:
    """Half-rank steps (stage h = phase 0, the other = phase 1) as rank r's own."""
    h = min(r, pp - 1 - r)
    second = r >= pp // 2
    out: list[Step] = []
    for stage, kind, mb in steps:
        direction = int(stage != h) ^ second
        out.append((r if direction == 0 else 2 * pp - 1 - r, kind,
                    mb + (m // 2 if direction else 0)))
    return out


def first_stages(pp: int) -> frozenset[int]:
    """Where micro-batches enter: each direction's first stage."""
    return frozenset({0, pp})


def last_stages(pp: int) -> frozenset[int]:
    """Where micro-batches leave (the loss): each direction's last stage."""
    return frozenset({pp - 1, 2 * pp - 1})


def dualpipe_model_order(pp: int, m: int) -> dict[int, list[Step]]:
    """`dualpipe_order` with each step named by the model stage it runs (0 .. pp - 1, the
    layers of `traces.stage_split`'s pp stages): direction 1's stage pp + s is the second
    copy's stage s. The plan builder runs this form: rank r holds stage r of copy 0 and
    stage pp - 1 - r of copy 1, the micro-batch telling the copy and so the peers
    (`traces.schedule_rules.dualpipe_rank`)."""
    return {r: [(stage % pp, kind, mb) for stage, kind, mb in steps]
            for r, steps in dualpipe_order(pp, m).items()}
