"""DualPipeV (`traces.dualpipev_order`): PyTorch's ScheduleDualPipeV order with its full
backwards as B then W and its overlapped pairs as F then B, W; zbv's V placement; its rules;
its bubble against zbv's and 1F1B's."""

from __future__ import annotations

import pytest

from sim.models.memory import peak_in_flight
from traces.errors import ConfigError
from traces.layout import Layout
from traces.pipeline import build_schedule
from traces.zero_bubble import makespan

CASES = [(pp, m) for pp in (1, 2, 3, 4) for m in (2 * pp, 2 * pp + 1, 3 * pp, 4 * pp + 3)]


def torch_order(pp: int, m: int) -> dict[int, list[str]]:
    """ScheduleDualPipeV's pipeline_order, made without stages or a process group (its
    order-making method reads only the fields set here), written in this simulator's kinds:
    I (input gradients) as B, a full backward B as B then W, an OVERLAP_F_B as its two
    sub-actions in turn."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    obj = object.__new__(schedules.ScheduleDualPipeV)
    obj.pp_group_size, obj._n_microbatches, obj.n_local_stages = pp, m, 2
    obj.num_stages = obj._num_stages = 2 * pp
    out = {}
    for r in range(pp):
        steps: list[str] = []
        for action in obj._calculate_single_rank_operations(r):
            for a in action.sub_actions or (action,):
                kind, head = a.computation_type.value, f"{a.stage_index}"
                if kind == "B":
                    steps += [f"{head}B{a.microbatch_index}", f"{head}W{a.microbatch_index}"]
                else:
                    steps.append(f"{head}{kind.replace('I', 'B')}{a.microbatch_index}")
        out[r] = steps
    return out


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_dualpipev_is_torch_order(pp, m):
    mine = build_schedule("dualpipev", pp, m, 2)  # validated on the V: each F, B, W once, and
    # the deadlock checker runs it to the end
    assert {r: [str(a) for a in acts] for r, acts in mine.items()} == torch_order(pp, m)


def test_stages_sit_in_zbvs_v():
    layout = Layout(pp=4, vp=2, schedule="dualpipev", global_batch=8)
    assert [layout.stages_of_rank(r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [layout.stage_rank(k) for k in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("per", [2, 3, 4])
def test_dualpipev_bubble_at_equal_times(pp, per):
    """With T_F = T_B = T_W = T per chunk pass (a full backward 2T) and m = per * pp >= 2 pp,
    the step is 6mT + (pp - 1)T, zbv's, against 1F1B's 6mT + 6(pp - 1)T in the same units (a
    whole-stage pass is two chunk passes): with a pair's halves run one after the other (no
    overlap modelled) DualPipeV's order buys nothing over zbv's at equal times; what it adds,
    one micro-batch's communication hidden behind the other's compute, is not simulated yet."""
    m = per * pp
    times = {"F": 1.0, "B": 1.0, "W": 1.0}
    step = makespan(build_schedule("dualpipev", pp, m, 2), times)
    assert step == 6 * m + (pp - 1)
    assert step == makespan(build_schedule("zbv", pp, m, 2), times)
    assert makespan(build_schedule("1f1b", pp, m, 1), {"F": 2.0, "B": 4.0}) == 6 * m + 6 * (pp - 1)


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_dualpipev_holds_one_chunk_pass_more_than_zbv(pp):
    """Each rank holds 2 pp + 1 chunk passes at its peak (activations until W): 2 pp after its
    warm-up, and an overlapped pair's forward stores its activations before its backward
    frees the other's; zbv holds 2 pp."""
    schedule = build_schedule("dualpipev", pp, 2 * pp, 2)
    assert [peak_in_flight(schedule[r]) for r in range(pp)] == [2 * pp + 1] * pp


@pytest.mark.parametrize(("keys", "message"), [
    ({"vp": 1, "global_batch": 4}, "parallel.vp: 1; dualpipev"),
    ({"vp": 3, "global_batch": 4}, "parallel.vp: 3; dualpipev"),
    ({"vp": 2, "global_batch": 3}, "parallel: 3 micro-batches are fewer than 2 pp = 4"),
    ({"vp": 2, "global_batch": 4, "pp_first_layers": 2},
     "parallel.schedule: \"dualpipev\" places its stages in a V"),
])
def test_bad_layouts_are_refused(keys, message):
    with pytest.raises(ConfigError, match=message):
        Layout(pp=2, schedule="dualpipev", **keys)
