"""zb1p and zbv folded (one rank per pipeline stage stands for its TP peers and DP replicas)
against the unfolded run: every op of the representatives starts and ends as unfolded."""

import pytest

from sim.config import experiment_from_dict
from sim.simulate import predict


def experiment(schedule: str, vp: int, tp: int, pp: int, dp: int):
    world = tp * pp * dp
    config = {"model": {"layers": 8, "hidden": 512, "heads": 16, "seq_len": 512,
                        "vocab": 4096},
              "parallel": {"tp": tp, "pp": pp, "dp": dp, "vp": vp, "schedule": schedule,
                           "micro_batch": 1, "global_batch": 8 * dp},
              "cluster": {"preset": "dgx-h100", "nodes": max(1, world // 8),
                          "gpus_per_node": min(8, world), "fabric": "rail"}}
    return experiment_from_dict(config)


@pytest.mark.parametrize(("schedule", "vp", "tp", "pp", "dp"), [
    ("zb1p", 1, 2, 4, 2), ("zb1p", 2, 2, 2, 2), ("zbv", 2, 2, 4, 2), ("zbv", 2, 1, 4, 4)])
def test_folded_equals_unfolded(schedule, vp, tp, pp, dp):
    exp = experiment(schedule, vp, tp, pp, dp)
    unfolded, every = predict(exp, fold=False)
    folded, some = predict(exp, fold=True)
    assert len(some.plan.ops) < len(every.plan.ops)
    assert folded.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-9)
    for r in some.plan.ops:
        assert len(some.starts[r]) == len(every.starts[r])
        for a, b in zip(some.ends[r], every.ends[r], strict=True):
            assert a == pytest.approx(b, rel=1e-9, abs=1e-15)
