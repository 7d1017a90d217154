"""Pipeline schedules: text form, the real 1F1B order, the validator, and exact bubbles."""

import pytest

from sim.engine.replay import replay
from topology import build_cluster
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Phase
from traces.pipeline import Action, build_schedule, format_schedule, one_f_one_b, validate
from traces.plan import build


def test_actions_print_and_parse():
    assert str(Action(2, "F", 0)) == "2F0" and str(Action(1, "B", 13)) == "1B13"
    assert Action.parse("12B7") == Action(12, "B", 7)
    with pytest.raises(ConfigError, match="'2X0' is not an action"):
        Action.parse("2X0")


def test_one_f_one_b_is_pipedream_flush():
    text = format_schedule(one_f_one_b(4, 6))
    assert text.splitlines() == [
        "rank 0: 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5",
        "rank 1: 1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1B4 1B5",
        "rank 2: 2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2B5",
        "rank 3: 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5",
    ]


def test_interleaved_follows_megatron_order():
    schedule = build_schedule("interleaved", 2, 4, 2)
    assert " ".join(map(str, schedule[0])) == \
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3"



def test_interleaved_warms_up_by_rank_even_when_micro_batches_equal_stages():
    # Megatron-Core's interleaved schedule (and PyTorch's ScheduleInterleaved1F1B): rank r
    # warms up with min(2(pp - r - 1) + (vp - 1) pp, m vp) forwards, then alternates one
    # forward and one backward; with m == pp = 4, vp = 2 the warm-ups are 8, 8, 6, 4, so the
    # first backward comes after 8, 8, 7, 5 forwards (older Megatron ran all 8 first on every
    # rank whenever m == pp).
    schedule = build_schedule("interleaved", 4, 4, 2)
    first_backward = [[a.kind for a in schedule[r]].index("B") for r in range(4)]
    assert first_backward == [8, 8, 7, 5]
    assert " ".join(map(str, schedule[3][:7])) == "3F0 3F1 3F2 3F3 7F0 7B0 7F1"

def test_validator_rejects_a_missing_pass_and_marks_a_deadlock():
    schedule = one_f_one_b(2, 2)
    schedule[1] = schedule[1][:-1]
    with pytest.raises(ConfigError, match="rank 1 must run each of its stages"):
        validate(schedule, 2, 2)
    bad = {0: [Action(0, "F", 0), Action(0, "B", 1), Action(0, "F", 1), Action(0, "B", 0)],
           1: [Action(1, "F", 0), Action(1, "B", 0), Action(1, "F", 1), Action(1, "B", 1)]}
    with pytest.raises(ConfigError, match=r"deadlock(.|\n)*rank 0: 0F0 \[0B1\] 0F1 0B0"):
        validate(bad, 2, 2)


class UnitCompute:
    """Equal stages: every layer's forward takes 1 s and its backward 2 s (its two GEMMs
    cost it all); nothing else costs."""

    def duration(self, op):
        if op.name in ("qkv", "fc1"):
            return {Phase.FWD: 0.5, Phase.BWD: 1.0}[op.phase]
        return 0.0


@pytest.mark.parametrize(("schedule", "vp"), [("gpipe", 1), ("1f1b", 1), ("interleaved", 2),
                                              ("interleaved", 4)])
@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("m_per_pp", [1, 2, 3])
def test_bubble_over_ideal_time_is_exactly_p_minus_1_over_v_m(schedule, vp, pp, m_per_pp):
    m = pp * m_per_pp
    model = ModelSpec(layers=8 * 4, hidden=64, heads=4, seq_len=16, vocab=64)
    layout = Layout(pp=pp, vp=vp, schedule=schedule, global_batch=m)
    cluster = build_cluster("dgx-h100", nodes=1, gpus_per_node=pp)
    step = replay(build(model, layout), cluster, UnitCompute(), network="ideal").step_time_s
    ideal = m * (model.layers // pp) * 3.0  # per micro-batch: 1 s forward + 2 s backward a layer
    assert (step - ideal) / ideal == pytest.approx((pp - 1) / (vp * m), rel=1e-12)
