"""The loss buffer (fp32 logits of one micro-batch) is counted on the rank holding the head:
rank pp - 1, rank 0 in zbv/dualpipev's V, both ends under DualPipe's two copies."""

import pytest

from sim.models.memory import LOGITS_BYTES, holds_head, working_bytes
from traces.layout import Layout, Schedule
from traces.model import ModelSpec

SMALL = ModelSpec(layers=8, hidden=64, heads=4, seq_len=32, vocab=128)
LOGITS = LOGITS_BYTES * 32 * 1 * 128  # 4 * s * b * V, t = 1


def head_ranks(schedule: Schedule, pp: int) -> set[int]:
    """Closed form: which pipeline ranks hold the last stage."""
    if schedule in (Schedule.ZBV, Schedule.DUALPIPEV):
        return {0}
    if schedule is Schedule.DUALPIPE:
        return {0, pp - 1}
    return {pp - 1}


@pytest.mark.parametrize("schedule", [Schedule.ONE_F_ONE_B, Schedule.ZBV, Schedule.DUALPIPEV,
                                      Schedule.DUALPIPE])
@pytest.mark.parametrize("pp", [2, 4])
def test_logits_on_the_rank_holding_the_head(schedule, pp):
    vp = 2 if schedule in (Schedule.ZBV, Schedule.DUALPIPEV) else 1
    layout = Layout(pp=pp, vp=vp, global_batch=4 * pp, schedule=schedule)
    expected = head_ranks(schedule, pp)
    assert {r for r in range(pp) if holds_head(layout, r)} == expected
    assert [working_bytes(SMALL, layout, r) for r in range(pp)] == \
        [LOGITS if r in expected else 0.0 for r in range(pp)]
