"""The plan builder: communication volumes (seed 002 §4.3.1), FLOPs, matching, folding."""

import dataclasses
import time
from collections import Counter

import pytest

from sim.collectives.base import busbw_factor
from tests.traces.megatron_count import megatron_op
from traces.layout import Axis, Layout
from traces.layout_rules import check_layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase
from traces.plan import build, plan_size
from traces.purpose import GradStat
from traces.step_flops import megatron_step_flops

MODEL = ModelSpec(layers=8, hidden=256, heads=8, seq_len=128, vocab=1024)


def volume(plan, rank, kinds=None, streams=None):
    """Bytes a rank sends per step: nccl-tests' bus factor times the buffer size; the step
    end's gradient statistics left out (4-byte all-reduces over every rank under ZeRO, over
    the model-parallel ranks without)."""
    total = 0.0
    for op in plan.ops[rank]:
        if op.kind.is_collective and (kinds is None or op.kind in kinds) and (
                streams is None or op.stream in streams) and not isinstance(op.purpose,
                                                                             GradStat):
            total += busbw_factor(op.kind, len(op.group)) * op.size_bytes
    return total


def dp_volume(zero, dp=8, **kw):
    layout = Layout(dp=dp, zero=zero, global_batch=dp, **kw)
    check_layout(MODEL, layout)
    return volume(build(MODEL, layout), 0)


def test_zero2_reduce_scatter_plus_all_gather_moves_what_dp_all_reduce_moves():
    dp = dp_volume(0)
    assert dp > 0
    assert dp_volume(1) == pytest.approx(dp, rel=1e-12)
    assert dp_volume(2) == pytest.approx(dp, rel=1e-12)


def test_zero3_moves_one_and_a_half_times_dp():
    assert dp_volume(3) == pytest.approx(1.5 * dp_volume(0), rel=1e-12)


def test_sequence_parallel_moves_what_tensor_parallel_moves_plus_the_backward_gathers():
    def tp_volume(sp):
        layout = Layout(tp=4, sp=sp, global_batch=2)
        plan = build(MODEL, layout)
        tp_ops = [op for op in plan.ops[0] if op.name == "tp"]
        kinds = Counter(op.kind for op in tp_ops)
        return sum(busbw_factor(op.kind, 4) * op.size_bytes for op in tp_ops), kinds

    tp, tp_kinds = tp_volume(False)
    sp, sp_kinds = tp_volume(True)
    # per micro-batch (2): 2 all-reduces forward and 2 backward per layer (Megatron's f and g),
    # plus the embedding's forward and the logits' backward ...
    units = 2 * MODEL.layers + 1
    assert tp_kinds == {OpKind.ALL_REDUCE: 2 * units * 2}
    # ... each split into an all-gather and a reduce-scatter with SP, and the backward of qkv,
    # fc1 (per layer) and logits all-gathers its saved input shard once more
    assert sp_kinds == {OpKind.ALL_GATHER: 3 * units * 2, OpKind.REDUCE_SCATTER: 2 * units * 2}
    # An all-reduce moves what an all-gather plus a reduce-scatter move (2(n-1)/n): the extra
    # all-gathers are half an all-reduce each, units of them for 2·units all-reduces: + 1/4.
    assert sp == pytest.approx(1.25 * tp, rel=1e-12)


@pytest.mark.parametrize(("recompute", "full"), [("full", True), ("none", False)])
def test_compute_ops_add_up_to_megatrons_step_flops(recompute, full):
    layout = Layout(tp=2, pp=2, dp=2, global_batch=8, recompute=recompute)
    check_layout(MODEL, layout)
    plan = build(MODEL, layout)
    flops = sum(megatron_op(op) for ops in plan.ops.values() for op in ops)
    assert flops == pytest.approx(megatron_step_flops(MODEL, 8, full), rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
def test_pipeline_messages_are_b_s_h_divided_by_tp_and_gathered_without_sp(sp):
    """Each TP rank sends its 1/t of the activation (Megatron-LM's scatter-gather in the
    pipeline; with SP its sequence shard); without SP every receive is followed by a `tp`
    all-gather of the whole b·s·h, which waits for it and which the next kernel waits for."""
    layout = Layout(tp=4, pp=2, sp=sp, micro_batch=2, global_batch=4)
    check_layout(MODEL, layout)
    plan = build(MODEL, layout)
    full = 2 * 128 * 256 * 2
    sizes = {op.size_bytes for ops in plan.ops.values() for op in ops if op.kind.is_p2p}
    assert sizes == {full / 4}
    for rank, ops in plan.ops.items():
        recvs = [i for i, op in enumerate(ops) if op.kind is OpKind.RECV]
        assert len(recvs) == 2  # two micro-batches: activations in (stage 1) or gradients in
        for i in recvs:
            gathers = [j for j, op in enumerate(ops) if i in op.deps and op.name == "tp"]
            if sp:
                assert gathers == []
                continue
            assert gathers == [i + 1]
            gather = ops[i + 1]
            assert (gather.kind, gather.stream, gather.size_bytes, gather.group) == (
                OpKind.ALL_GATHER, "compute", full, layout.group(rank, Axis.TP))
            assert gather.phase is (Phase.FWD if ops[i].tag == "act" else Phase.BWD)
            assert gather.microbatch == ops[i].microbatch and gather.layer is None
            first_kernel = next(j for j in range(i + 2, len(ops)) if ops[j].kind == "compute")
            assert i + 1 in ops[first_kernel].deps


def test_sends_and_receives_name_the_layer_whose_input_or_output_they_carry():
    layout = Layout(pp=2, vp=2, schedule="interleaved", global_batch=4)
    check_layout(MODEL, layout)  # 8 layers, 4 stages of 2: rank 0 runs stages 0 and 2
    plan = build(MODEL, layout)
    carried = {(rank, str(op.kind), op.tag, op.layer) for rank, ops in plan.ops.items()
               for op in ops if op.kind.is_p2p}
    assert carried == {
        (0, "send", "act", 1), (1, "recv", "act", 2), (1, "send", "act", 3),
        (0, "recv", "act", 4), (0, "send", "act", 5), (1, "recv", "act", 6),
        (1, "recv", "grad", 3), (1, "send", "grad", 2), (0, "recv", "grad", 1),
        (0, "recv", "grad", 5), (0, "send", "grad", 4), (1, "send", "grad", 6)}


@pytest.mark.parametrize("layout", [
    Layout(tp=2, pp=2, dp=2, global_batch=8),
    Layout(tp=2, pp=4, dp=1, vp=2, schedule="interleaved", global_batch=8),
    Layout(pp=2, dp=2, zero=3, global_batch=4, recompute="full"),
])
def test_every_send_meets_a_receive_and_groups_agree(layout):
    check_layout(MODEL, layout)
    plan = build(MODEL, layout)
    sends, recvs = Counter(), Counter()
    calls: dict[tuple[int, ...], dict[int, list]] = {}
    for rank, ops in plan.ops.items():
        for op in ops:
            if op.kind is OpKind.SEND:
                sends[(rank, op.peer, op.tag, op.size_bytes)] += 1
            elif op.kind is OpKind.RECV:
                recvs[(op.peer, rank, op.tag, op.size_bytes)] += 1
            elif op.kind.is_collective:
                calls.setdefault(op.group, {}).setdefault(rank, []).append(
                    (op.kind, op.size_bytes))
    assert sends == recvs and sends
    for group, by_rank in calls.items():
        assert sorted(by_rank) == sorted(group)  # every member calls on its communicator ...
        assert len({tuple(c) for c in by_rank.values()}) == 1  # ... the same sequence


def test_folded_plan_is_the_representatives_part_of_the_full_plan():
    layout = Layout(tp=2, pp=2, dp=2, zero=1, global_batch=8)
    check_layout(MODEL, layout)
    full, folded = build(MODEL, layout), build(MODEL, layout, ranks=layout.representatives())
    assert folded.meta.fold == layout and full.meta.fold is None
    assert folded.ranks == [0, 4]
    assert all(folded.ops[r] == full.ops[r] for r in folded.ranks)


def test_gradients_are_reduced_once_per_step_for_dp_and_per_micro_batch_for_zero2():
    def reductions(zero):
        layout = Layout(dp=2, zero=zero, global_batch=8)  # 4 micro-batches
        plan = build(MODEL, layout)
        return [op.microbatch for op in plan.ops[0] if op.stream == "dp"
                and op.kind is not OpKind.ALL_GATHER and not isinstance(op.purpose, GradStat)]

    assert set(reductions(0)) == {3}  # after the last micro-batch: gradient accumulation
    assert set(reductions(2)) == {0, 1, 2, 3}


def test_zero3_gathers_each_layer_before_forward_and_backward():
    layout = Layout(dp=2, zero=3, global_batch=2)
    plan = build(MODEL, layout)
    gathers = Counter((op.layer, op.phase) for op in plan.ops[0] if op.stream == "zero_ag")
    for layer in range(MODEL.layers):
        assert gathers[(layer, Phase.FWD)] == 1 and gathers[(layer, Phase.BWD)] == 1
    ops = plan.ops[0]
    first_ln = next(i for i, op in enumerate(ops) if op.name == "ln1")
    assert any(ops[d].stream == "zero_ag" for d in ops[first_ln].deps)  # waits for its gather


@pytest.mark.parametrize("options", [
    dict(tp=2, pp=4, recompute="full"),
    dict(tp=2, sp=True, dp=2, zero=3),
    dict(pp=2, vp=2, schedule="interleaved", recompute="selective"),
    dict(tp=2, pp=2, dp=2, vp=2, schedule="interleaved", sp=True, zero=1),
    dict(pp=4, dp=2, zero=2, overlap_grad_reduce=False),  # TP 1
    dict(tp=1, pp=1, dp=4, zero=3),
])
def test_the_dry_count_is_the_built_plans_op_count_exactly(options):
    model = ModelSpec(layers=8, hidden=256, heads=8, seq_len=64, vocab=1024, attention="unfused")
    layout = Layout(global_batch=16, **options)
    full = build(model, layout)
    assert plan_size(model, layout) == full.num_ops()
    folded = layout.representatives()
    assert plan_size(model, layout, folded) == build(model, layout, folded).num_ops()
    assert plan_size(model, layout, [1, layout.world - 1]) == sum(
        len(full.ops[r]) for r in (1, layout.world - 1))
    # what the count rests on: a rank's op count depends on its pipeline coordinate only
    by_pp: dict[int, set[int]] = {}
    for rank, ops in full.ops.items():
        by_pp.setdefault(layout.coords(rank).pp, set()).add(len(ops))
    assert all(len(counts) == 1 for counts in by_pp.values()), by_pp


def test_a_plan_is_refused_once_its_lowered_ops_stand_for_more_than_the_limit(monkeypatch):
    import traces.plan as plan
    from traces.errors import ConfigError

    model = ModelSpec(layers=8, hidden=256, heads=8, seq_len=64, vocab=1024)
    layout = Layout(tp=2, pp=2, dp=2, global_batch=8)
    size = plan_size(model, layout)
    monkeypatch.setattr(plan, "MAX_PLAN_OPS", size)
    assert build(model, layout).num_ops() == size  # at the limit: built
    monkeypatch.setattr(plan, "MAX_PLAN_OPS", size - 1)
    with pytest.raises(ConfigError, match=rf"^plan: at least [\d,]+ ops for 8 ranks, more than "
                                          rf"the {size - 1:,} parasim builds"):
        build(model, layout)


def test_gpt3_unfolded_on_16384_gpus_is_refused_in_seconds():
    from sim.config import example_path, load_experiment
    from traces.errors import ConfigError

    exp = load_experiment(example_path())
    big = dataclasses.replace(exp.layout, dp=128, global_batch=16 * exp.layout.global_batch)
    assert big.world == 16384
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"ops for 16,384 ranks, .* or simulate folded"):
        build(exp.model, big)
    assert time.perf_counter() - start < 5.0


def test_a_plan_too_big_to_build_is_one_line_before_anything_is_built():
    from traces.errors import ConfigError
    from traces.plan import MAX_PLAN_OPS

    model = ModelSpec(layers=1024, hidden=256, heads=8, seq_len=64, vocab=1024)
    layout = Layout(pp=8, dp=64, global_batch=65536)  # 1024 micro-batches on 512 ranks
    with pytest.raises(ConfigError, match=f"more than the {MAX_PLAN_OPS:,} parasim builds"):
        build(model, layout)


def test_the_op_limit_suggests_folding_only_when_the_plan_is_not_folded():
    from traces.errors import ConfigError

    model = ModelSpec(layers=1024, hidden=256, heads=8, seq_len=64, vocab=1024)
    layout = Layout(pp=8, dp=64, global_batch=65536)
    with pytest.raises(ConfigError, match="or simulate folded"):
        build(model, layout)
    big = Layout(pp=8, dp=64, global_batch=64 * 8 * 4096)  # too big even folded
    with pytest.raises(ConfigError, match=r"\(fewer micro-batches or layers\)$"):
        build(model, big, ranks=big.representatives())


def test_the_op_limit_does_not_suggest_folding_ranks_already_one_per_class():
    """Folded by identity (skewed experts, per-rank speeds) every rank may be its own class:
    the line says so instead of suggesting the fold it already is."""
    from traces.errors import ConfigError

    model = ModelSpec(layers=1024, hidden=256, heads=8, seq_len=64, vocab=1024)
    layout = Layout(pp=8, dp=64, global_batch=65536)
    with pytest.raises(ConfigError, match=r"folded by identity, 512 of the 512 ranks still "
                                          r"differ in expert loads, speed or network position\)$"):
        build(model, layout, classes=True)
