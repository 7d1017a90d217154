"""Zero-bubble ZB-V (`traces.zero_bubble_order.zbv_order`): PyTorch's ScheduleZBVZeroBubble
order, the V placement of stages, its bubble and in-flight activations, its rules."""

from __future__ import annotations

import pytest

from sim.models.memory import peak_in_flight
from traces.errors import ConfigError
from traces.layout import Axis, Layout
from traces.model import ModelSpec
from traces.pipeline import build_schedule
from traces.plan import build
from traces.zero_bubble import makespan

CASES = [(pp, m) for pp in (1, 2, 3, 4) for m in (1, 2, 3, 4, 5, 6, 8, 12)]


def torch_order(pp: int, m: int) -> dict[int, list[str]]:
    """ScheduleZBVZeroBubble's pipeline_order, made without stages or a process group (its
    order-making method reads only the fields set here); I printed as B."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    obj = object.__new__(schedules.ScheduleZBVZeroBubble)
    obj.pp_group_size, obj._n_microbatches, obj.n_local_stages = pp, m, 2
    obj.num_stages = obj._num_stages = 2 * pp
    return {r: [str(a).replace("I", "B") for a in obj._calculate_single_rank_operations(r)
                if a is not None] for r in range(pp)}


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_zbv_is_torch_order(pp, m):
    mine = build_schedule("zbv", pp, m, 2)  # validated on the V: every F, B, W once, no deadlock
    assert {r: [str(a) for a in acts] for r, acts in mine.items()} == torch_order(pp, m)


def test_stages_sit_in_a_v():
    layout = Layout(pp=4, vp=2, schedule="zbv", global_batch=8)
    assert [layout.stages_of_rank(r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [layout.stage_rank(k) for k in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    interleaved = Layout(pp=4, vp=2, schedule="interleaved", global_batch=8)
    assert [interleaved.stage_rank(k) for k in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("per", [2, 3, 4])
def test_zbv_bubble_at_equal_times(pp, per):
    """With T_F = T_B = T_W = T per chunk pass and m >= 2 pp, the step is 6mT + (pp - 1)T:
    a bubble of (pp - 1)T against ZB-1P's 2(pp - 1)T and 1F1B's 6(pp - 1)T in the same units
    (a whole-stage pass is two chunk passes)."""
    m = per * pp
    step = makespan(build_schedule("zbv", pp, m, 2), {"F": 1.0, "B": 1.0, "W": 1.0})
    assert step == 6 * m + (pp - 1)
    zb1p = makespan(build_schedule("zb1p", pp, m, 1), {"F": 2.0, "B": 2.0, "W": 2.0})
    assert zb1p == 6 * m + 2 * (pp - 1)


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_zbv_holds_1f1b_memory(pp):
    """Each rank holds 2 pp chunk passes at its peak (activations until W), each half a
    stage's layers: pp whole-stage micro-batches, 1F1B's first rank's peak."""
    schedule = build_schedule("zbv", pp, 2 * pp, 2)
    assert [peak_in_flight(schedule[r]) for r in range(pp)] == [2 * pp] * pp


def test_no_message_at_the_turn_of_the_v():
    """Rank pp - 1 runs stages pp - 1 and pp: the activation and its gradient stay on the GPU;
    every other stage boundary sends one each way per micro-batch."""
    model = ModelSpec(layers=8, hidden=256, heads=8, seq_len=128, vocab=1024)
    layout = Layout(pp=2, vp=2, schedule="zbv", global_batch=4)
    plan = build(model, layout)
    m = layout.num_microbatches
    for rank in range(2):
        p2p = [op for op in plan.ops[rank] if op.kind.is_p2p]
        peer = layout.rank_of(layout.coords(rank).moved(Axis.PP, 1 - rank))
        assert {op.peer for op in p2p} == {peer}
        assert len(p2p) == 2 * 2 * m  # two boundaries a rank, an F and a B message each
    assert not any(op.purpose.__class__.__name__ == "EmbeddingGrads" for op in plan.ops[0])


@pytest.mark.parametrize(("keys", "message"), [
    ({"vp": 1}, "parallel.vp: 1; zbv"),
    ({"vp": 3}, "parallel.vp: 3; zbv"),
    ({"vp": 2, "pp_first_layers": 2}, "parallel.schedule: \"zbv\" places its stages in a V"),
    ({"vp": 2, "account_for_loss": True}, "parallel.schedule: \"zbv\""),
])
def test_bad_layouts_are_refused(keys, message):
    with pytest.raises(ConfigError, match=message):
        Layout(pp=2, schedule="zbv", global_batch=4, **keys)
