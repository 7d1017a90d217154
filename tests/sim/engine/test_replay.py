"""The step replay: stream and collective semantics, contention, folding, determinism."""

import dataclasses

import pytest

from sim.engine.replay import replay
from sim.models.compute import ComputeModel
from sim.models.interference import HostInterference
from sim.profile import default_profile
from topology import build_cluster
from traces.errors import ConfigError
from traces.header import check_fold_ranks
from traces.header_json import meta_from_json
from traces.layout import Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Trace
from traces.plan import build

MODEL = ModelSpec(layers=8, hidden=1024, heads=16, seq_len=1024, vocab=32000)
MiB = 2**20


class Fixed:
    """Compute ops take the seconds in their `flops` field (hand-built traces)."""

    def duration(self, op):
        return op.flops


def compute(seconds, stream="compute", deps=()):
    return Op(kind=OpKind.COMPUTE, stream=stream, name="x", flops=seconds, deps=deps)


def test_a_collective_starts_when_every_member_has_issued_it_and_stalls_only_its_stream(h100):
    size = 64 * MiB
    ar = Op(kind=OpKind.ALL_REDUCE, stream="comm", group=(0, 1), size_bytes=size)
    plan = Trace({
        0: (compute(1e-3), Op(kind=OpKind.ALL_REDUCE, stream="comm", group=(0, 1),
                              size_bytes=size, deps=(0,))),
        1: (ar, compute(5e-4, deps=()), compute(2e-3, stream="other")),
    })
    times = replay(plan, h100, Fixed())
    alone = replay(Trace({0: (ar,), 1: (ar,)}), h100, Fixed()).ends[0][0]
    assert times.starts[0][1] == times.starts[1][0] == 1e-3  # rank 1 waited for rank 0
    assert times.ends[1][0] == pytest.approx(1e-3 + alone, rel=1e-12)
    assert times.starts[1][1] == 0.0  # compute of rank 1 is on its own stream: not stalled
    assert times.ends[1][2] == 2e-3


def test_calls_meet_in_program_order_whichever_stream_reaches_its_call_first(h100):
    # ZeRO-3's shape: a gather and a reduction on one group from two streams. Rank 1's gather
    # stream is busy, so its reduction (call 1) is reached first; it meets rank 0's call 1,
    # and does not wait for call 0 (the executor's communicators are per stream and group).
    def op(kind, stream, deps=()):
        return Op(kind=kind, stream=stream, group=(0, 1), size_bytes=MiB, deps=deps)

    gather, scatter = OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER
    plan = Trace({
        0: (op(gather, "zero_ag"), op(scatter, "zero_rs")),
        1: (compute(1e-3, stream="zero_ag"), op(gather, "zero_ag"), op(scatter, "zero_rs")),
    })
    times = replay(plan, h100, Fixed())
    assert times.starts[0][1] == times.starts[1][2] == 0.0  # the reductions, at once
    assert times.starts[0][0] == times.starts[1][1] == 1e-3  # the gathers, when rank 1 is there
    alone = replay(Trace({0: plan.ops[0][:1], 1: plan.ops[0][:1]}), h100, Fixed()).step_time_s
    assert times.ends[1][1] == pytest.approx(1e-3 + alone, rel=1e-12)


def test_a_dp_all_reduce_and_pipeline_traffic_on_one_nic_slow_each_other():
    cluster = build_cluster("dgx-h100", nodes=2, fabric="rail")
    size = 256 * MiB
    send = Op(kind=OpKind.SEND, stream="pp", peer=8, size_bytes=size, tag="act")
    recv = Op(kind=OpKind.RECV, stream="pp", peer=0, size_bytes=size, tag="act")
    ar = Op(kind=OpKind.ALL_REDUCE, stream="dp", group=(0, 8), size_bytes=size)
    alone = replay(Trace({0: (send,), 8: (recv,)}), cluster, Fixed()).step_time_s
    both = replay(Trace({0: (send, ar), 8: (recv, ar)}), cluster, Fixed()).step_time_s
    # GPU0's NIC carries the send (S) and the all-reduce's ring hop (S as well, 2(n-1)/n = 1):
    # sharing the 50 GB/s link, both end at about twice the time of one.
    assert both == pytest.approx(2 * alone, rel=0.01)
    assert alone == pytest.approx(size / (50e9 * 0.96), rel=0.01)  # NDR's data rate


def test_send_waits_for_its_receive_and_a_missing_partner_is_reported(h100):
    send = Op(kind=OpKind.SEND, stream="s", peer=1, size_bytes=MiB, tag="t")
    recv = Op(kind=OpKind.RECV, stream="r", peer=0, size_bytes=MiB, tag="t", deps=(0,))
    times = replay(Trace({0: (send,), 1: (compute(1e-3, stream="c"), recv)}), h100, Fixed())
    assert times.starts[0][0] == times.starts[1][1] == 1e-3
    with pytest.raises(ConfigError, match="rank 0 op 0 .*send with peer 1"):
        replay(Trace({0: (send,), 1: (compute(1e-3),)}), h100, Fixed())


def test_mismatched_collectives_are_reported(h100):
    a = Op(kind=OpKind.ALL_REDUCE, stream="c", group=(0, 1), size_bytes=MiB)
    b = Op(kind=OpKind.ALL_GATHER, stream="c", group=(0, 1), size_bytes=MiB)
    with pytest.raises(ConfigError, match="issues all_gather .* another member issued all_reduce"):
        replay(Trace({0: (a,), 1: (b,)}), h100, Fixed())


@pytest.mark.parametrize(("op", "needle"), [
    (Op(kind=OpKind.SEND, stream="s", size_bytes=1.0), "send has peer None"),
    (Op(kind=OpKind.RECV, stream="s", peer=99, size_bytes=1.0), "recv has peer 99"),
    (Op(kind=OpKind.ALL_REDUCE, stream="s", group=(0, 0)), "needs two or more distinct ranks"),
    (Op(kind=OpKind.ALL_GATHER, stream="s", group=(0, 8)), "needs two or more distinct ranks"),
])
def test_malformed_communication_is_a_clear_error(h100, op, needle):
    with pytest.raises(ConfigError, match=needle):
        replay(Trace({0: (op,)}), h100, Fixed())


def test_measured_ops_keep_their_measured_duration(h100):
    model = ComputeModel(h100.accelerator, default_profile(h100.accelerator))
    op = Op(kind=OpKind.COMPUTE, stream="c", name="mlp", flops=1e15, start=2.0, end=2.25)
    assert replay(Trace({0: (op,)}), h100, model).ends[0][0] == 0.25


LAYOUTS = [
    Layout(tp=2, pp=2, dp=4, global_batch=16),
    Layout(tp=4, pp=2, dp=2, zero=1, global_batch=8, recompute="selective"),
    Layout(tp=2, pp=4, dp=2, vp=2, schedule="interleaved", global_batch=8),
    Layout(tp=2, pp=2, dp=4, sp=True, zero=3, global_batch=8, recompute="full"),
    Layout(tp=1, pp=2, dp=8, zero=2, global_batch=16),
    Layout(tp=2, cp=2, pp=2, dp=2, global_batch=8, recompute="selective"),
    Layout(tp=2, cp=2, pp=2, dp=2, cp_comm="all_gather", zero=1, sp=True, global_batch=8),
    Layout(tp=2, pp=4, dp=2, pp_first_layers=1, pp_last_layers=1, global_batch=8),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"tp{lay.tp}cp{lay.cp}pp{lay.pp}"
                         f"dp{lay.dp}z{lay.zero}{'sp' if lay.sp else ''}{lay.schedule}"
                         f"{lay.cp_comm if lay.cp > 1 else ''}{'uneven' if lay.uneven else ''}")
@pytest.mark.parametrize("fabric", ["rail", "fat-tree"])
def test_folded_run_equals_unfolded_run(layout, fabric):
    cluster = build_cluster("dgx-h100", nodes=2, fabric=fabric)
    check_layout(MODEL, layout, world=16, devices_per_server=8)
    model = ComputeModel(cluster.accelerator, default_profile(cluster.accelerator))
    full = replay(build(MODEL, layout), cluster, model)
    folded = replay(build(MODEL, layout, ranks=layout.representatives()), cluster, model)
    assert folded.step_time_s == full.step_time_s
    for rank in layout.representatives():
        assert folded.starts[rank] == full.starts[rank]
        assert folded.ends[rank] == full.ends[rank]


def test_folding_keeps_contention_from_the_copies_on_shared_uplinks():
    # One server per leaf at 2:1: the data-parallel rings of the 8 TP ranks share 4 uplinks.
    layout = Layout(tp=8, dp=2, global_batch=2)

    def step(ratio, ranks):
        cluster = build_cluster("dgx-h100", nodes=2, nodes_per_leaf=1, oversubscription=ratio)
        model = ComputeModel(cluster.accelerator, default_profile(cluster.accelerator))
        return replay(build(MODEL, layout, ranks=ranks), cluster, model).step_time_s

    reps = layout.representatives()
    assert step(2.0, None) > step(1.0, None)  # the uplinks are a bottleneck at 2:1 ...
    assert step(2.0, reps) == pytest.approx(step(2.0, None), rel=1e-9)  # ... folded too
    assert step(1.0, reps) == pytest.approx(step(1.0, None), rel=1e-9)


def test_simulation_is_deterministic():
    cluster = build_cluster("dgx-h100", nodes=2, nodes_per_leaf=1, oversubscription=2.0)
    layout = LAYOUTS[2]
    model = ComputeModel(cluster.accelerator, default_profile(cluster.accelerator))
    a = replay(build(MODEL, layout), cluster, model)
    b = replay(build(MODEL, layout), cluster, model)
    assert a.starts == b.starts and a.ends == b.ends


def test_network_models_order_ideal_analytic_flow():
    cluster = build_cluster("dgx-a100", nodes=2, nodes_per_leaf=1, oversubscription=2.0)
    layout = Layout(tp=2, pp=2, dp=4, global_batch=16)
    model = ComputeModel(cluster.accelerator, default_profile(cluster.accelerator))
    plan = build(MODEL, layout, ranks=layout.representatives())
    ideal, analytic, flow = (replay(plan, cluster, model, network=n).step_time_s
                             for n in ("ideal", "analytic", "flow"))
    assert ideal < analytic <= flow


def test_progress_is_reported_as_ops_done_of_ops_in_all(h100):
    plan = Trace({0: tuple(compute(1e-6) for _ in range(5000)), 1: (compute(1.0, stream="x"),)})
    calls = []
    replay(plan, h100, Fixed(), progress=lambda done, total: calls.append((done, total)))
    # Now and then (once 4096 more ops have finished), and once at the end.
    assert calls[-1] == (5001, 5001) and len(calls) == 2
    assert 4096 <= calls[0][0] < 5001 and calls[0][1] == 5001


def test_the_fold_is_read_from_the_plan_meta_old_and_new_spelling():
    layout = Layout(tp=2, pp=2, dp=4, global_batch=16)
    fold = {"axes": ["tp", "dp"], "layout": layout.to_dict()}
    assert meta_from_json({"fold": fold}, 3).fold == layout
    assert meta_from_json({"folded": True, "layout": layout.to_dict()}, 1).fold == layout
    assert meta_from_json({"fold": fold, "world": 16}, 3).fold == layout
    assert meta_from_json({"layout": layout.to_dict()}, 3).fold is None  # every rank
    with pytest.raises(ConfigError, match="meta.fold"):
        meta_from_json({"fold": {"axes": ["tp"], "layout": {}}}, 3)
    with pytest.raises(ConfigError, match=r"^trace: meta\.layout\.tensor: unknown key"):
        meta_from_json({"folded": True, "layout": {"tensor": 2}}, 1)
    check_fold_ranks(layout, [0, 8])
    with pytest.raises(ConfigError, match=r"folds onto ranks \[0, 8\] .* holds ranks \[0\]$"):
        check_fold_ranks(layout, [0])


def test_the_replay_checks_the_fold_against_the_plan_and_the_cluster(h100):
    layout = Layout(tp=2, pp=2, dp=4, global_batch=16)
    plan = build(MODEL, layout, ranks=layout.representatives())
    bad = Trace({0: plan.ops[0]}, plan.meta)  # a stage missing
    with pytest.raises(ConfigError, match=r"folds onto ranks \[0, 8\]"):
        replay(bad, h100, Fixed())
    with pytest.raises(ConfigError, match=r"^trace: its fold stands for tp 2 x cp 1 x pp 2 x "
                                          r"dp 4 = 16 ranks, more than the 8 accelerators of "):
        replay(plan, h100, Fixed())


def test_host_gaps_are_the_idle_time_no_stream_or_dependency_explains(h100):
    from sim.engine.replay import host_gaps

    ops = (Op(kind=OpKind.COMPUTE, stream="c", start=0.0, end=1.0),
           Op(kind=OpKind.COMPUTE, stream="c", start=1.5, end=2.0),   # 0.5 s after its stream
           Op(kind=OpKind.COMPUTE, stream="d", start=0.25, end=0.5),  # 0.25 s after the start
           Op(kind=OpKind.COMPUTE, stream="d", start=3.0, end=4.0, deps=(1,)))  # 1 s after dep
    assert host_gaps(Trace({0: ops})) == {0: [0.0, 0.5, 0.25, 1.0]}
    class Measured:
        def duration(self, op):
            return op.end - op.start

    times = replay(Trace({0: ops}), h100, Measured(), gaps=host_gaps(Trace({0: ops})))
    assert times.starts[0] == [0.0, 1.5, 0.25, 3.0]  # measured durations, measured gaps


def test_kernels_run_slower_while_their_rank_moves_data_by_the_interference(h100):
    shared_cores = HostInterference(comm_interference=1.0, compute_interference=0.0,
                                    compute_interference_delay_s=0.0)  # half speed

    send = Op(kind=OpKind.SEND, stream="s", peer=1, size_bytes=1e9, tag="t")
    recv = Op(kind=OpKind.RECV, stream="s", peer=0, size_bytes=1e9, tag="t")
    later = compute(1e-3, stream="c", deps=(1,))  # starts once the transfer is under way
    plan = Trace({0: (send, compute(1e-9, stream="c"), later),
                  1: (recv, compute(1e-9, stream="c"), later)})
    alone = replay(plan, h100, Fixed())
    shared = replay(plan, h100, Fixed(), interference=shared_cores)
    moving = alone.ends[0][0]
    assert moving > 2e-3  # the transfer outlasts the kernels
    for rank in (0, 1):  # both ends of the transfer are busy
        kernel = shared.ends[rank][2] - shared.starts[rank][2]
        assert kernel == pytest.approx(2 * (alone.ends[rank][2] - alone.starts[rank][2]))
    assert shared.ends[0][0] == alone.ends[0][0]  # the transfer itself is not slowed


@pytest.mark.parametrize("network", ["flow", "analytic"])
def test_data_beside_kernels_waits_for_a_core_then_moves_slower(h100, network):
    """compute_interference and its delay: a collective that starts while its ranks run a
    kernel ends delay + (1 + it) × its time alone after it starts; one that starts while
    they idle takes its time alone."""
    cores = HostInterference(comm_interference=0.0, compute_interference=1.5,
                             compute_interference_delay_s=2e-3)

    ar = Op(kind=OpKind.ALL_REDUCE, stream="comm", group=(0, 1), size_bytes=64 * MiB)
    beside = Trace({r: (compute(1.0), ar) for r in (0, 1)})  # the kernel is running
    after = Trace({r: (compute(1.0), dataclasses.replace(ar, deps=(0,))) for r in (0, 1)})
    alone = replay(beside, h100, Fixed(), network=network)
    moving = alone.ends[0][1] - alone.starts[0][1]
    assert 0 < moving < 0.1  # inside the kernel
    busy = replay(beside, h100, Fixed(), interference=cores, network=network)
    assert busy.ends[0][1] - busy.starts[0][1] == pytest.approx(2e-3 + 2.5 * moving, rel=1e-9)
    idle = replay(after, h100, Fixed(), interference=cores, network=network)
    assert idle.ends[0][1] - idle.starts[0][1] == pytest.approx(moving, rel=1e-9)
