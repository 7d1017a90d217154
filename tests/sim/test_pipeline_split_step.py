"""A simulated step under Megatron-Core's pipeline splits: the same layers per stage by two
keys give the same plan and step; a stage with a layer fewer runs that layer's time fewer."""

from __future__ import annotations

import pytest

from sim.config import experiment_from_dict
from sim.engine.replay import replay
from sim.models.compute import ComputeModel
from sim.profile import default_profile
from sim.simulate import predict
from topology import build_cluster
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.ops import OpKind
from traces.plan import build

MODEL = {"hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024}


def experiment(layers: int, **parallel: object):
    return experiment_from_dict({
        "model": {**MODEL, "layers": layers},
        "parallel": {"pp": 4, "global_batch": 8, **parallel},
        "cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 4}})


def test_both_ends_accounted_is_the_uneven_split_of_the_same_counts():
    """14 + E + L over PP 4: 4 a rank, 3 on the first and the last, as pp_first_layers =
    pp_last_layers = 3 states it: the same ops, the same step."""
    flags = experiment(14, account_for_embedding=True, account_for_loss=True)
    uneven = experiment(14, pp_first_layers=3, pp_last_layers=3)
    assert build(flags.model, flags.layout).ops == build(uneven.model, uneven.layout).ops
    assert predict(flags)[0].step_time_s == predict(uneven)[0].step_time_s
    stated = experiment(14, pipeline_layout="Ettt|tttt|tttt|tttL")
    assert build(stated.model, stated.layout).ops == build(uneven.model, uneven.layout).ops


def _compute(times, rank: int, what) -> float:
    return sum(what(op, s, e) for op, s, e in zip(times.plan.ops[rank], times.starts[rank],
                                                  times.ends[rank]) if op.kind is OpKind.COMPUTE)


def test_each_rank_runs_exactly_the_layers_the_split_gives_it():
    """6 + E + L over PP 2 x VP 2 (stages 1, 2, 2, 1) against 8 layers evenly (2, 2, 2, 2): the
    end stages hold a layer fewer, so each rank runs one layer's forward and backward fewer per
    micro-batch: exactly its FLOPs fewer, about its time (a kernel beside communication runs
    slower, `sim.models.interference`, so the same kernel is not timed alike everywhere), and
    the step is shorter."""
    parallel = dict(tp=2, pp=2, vp=2, schedule="interleaved", global_batch=4)
    flags = experiment(6, account_for_embedding=True, account_for_loss=True, **parallel)
    even = experiment(8, **parallel)
    (s_flags, t_flags), (s_even, t_even) = predict(flags, fold=False), predict(even, fold=False)
    m = even.layout.num_microbatches
    flops, busy = (lambda op, s, e: op.flops), (lambda op, s, e: e - s)
    for rank in (0, 2):  # pipeline ranks 0 and 1 (tp 2)
        layer = min(op.layer for op in t_even.plan.ops[rank] if op.layer is not None)

        def one(op, s, e, what, layer=layer):
            return what(op, s, e) if op.layer == layer and op.microbatch == 0 else 0.0

        for what, rel in ((flops, 1e-12), (busy, 0.05)):
            fewer = _compute(t_even, rank, what) - _compute(t_flags, rank, what)
            layer_mb = _compute(t_even, rank, lambda op, s, e, w=what: one(op, s, e, w))
            assert fewer == pytest.approx(m * layer_mb, rel=rel)
    assert s_flags.step_time_s < s_even.step_time_s


@pytest.mark.parametrize("keys", [
    dict(account_for_embedding=True, account_for_loss=True),   # 6 + 2 over 8: 0, 1 x 6, 0
    dict(pipeline_layout="Et|t|tt||t|t||L"),                    # empty stages 3 and 6
], ids=["account", "layout"])
def test_a_folded_run_equals_the_unfolded_run(keys):
    """One rank per pipeline stage stands for its TP peers and DP replicas exactly, whatever
    the stages hold."""
    cluster = build_cluster("dgx-h100", nodes=2, fabric="rail")
    model = ModelSpec(layers=6, hidden=1024, heads=16, seq_len=1024, vocab=32000)
    layout = Layout(tp=2, pp=4, dp=2, vp=2, schedule="interleaved", global_batch=8, **keys)
    check_layout(model, layout, world=16, devices_per_server=8)
    compute = ComputeModel(cluster.accelerator, default_profile(cluster.accelerator))
    full = replay(build(model, layout), cluster, compute)
    folded = replay(build(model, layout, ranks=layout.representatives()), cluster, compute)
    assert folded.step_time_s == full.step_time_s
    for rank in layout.representatives():
        assert folded.starts[rank] == full.starts[rank]
        assert folded.ends[rank] == full.ends[rank]
