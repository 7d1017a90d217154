"""Per purpose, the plan builder emits it where Megatron-LM puts that communication: beside
which kernel, in which phase, on which group and stream, of what size (docs/plan-ops.md)."""

from __future__ import annotations

import dataclasses

from tests.traces.test_purpose import LAYOUTS, MODEL, _plan
from traces.kernel_groups import STEP_KERNELS
from traces.layout import Axis, Layout
from traces.ops import Op, OpKind, Phase, Stream
from traces.plan.tensor import tp_sites
from traces.purpose import (
    CrossEntropyStat,
    EmbeddingGrads,
    GradBucket,
    Kernel,
    KernelRun,
    MessageGather,
    ParamGather,
    PipeMessage,
    SpGrads,
    Stat,
    TpSite,
    UnitGather,
    UnitGradReduce,
)

ACT = 1 * 32 * 64 * 2  # b·s·h in bf16


def _layout(name: str) -> Layout:
    return Layout(**LAYOUTS[name])


def _kernel(op: Op | None) -> Kernel | None:
    return op.purpose.kernel if op is not None and isinstance(op.purpose, KernelRun) else None


def _neighbours(ops: tuple[Op, ...], i: int) -> tuple[Op | None, Op | None]:
    before = next((ops[j] for j in range(i - 1, -1, -1) if ops[j].kind is OpKind.COMPUTE), None)
    after = next((ops[j] for j in range(i + 1, len(ops)) if ops[j].kind is OpKind.COMPUTE), None)
    return before, after


def test_tp_sites_sit_beside_their_kernel_inline_on_the_tp_group():
    for name in ("tp", "tp sp pp recompute", "zero3 sp"):
        layout, plan = _layout(name), _plan(name)
        sites = tp_sites(layout.sp)
        for rank, ops in plan.ops.items():
            for i, op in enumerate(ops):
                if not isinstance(op.purpose, TpSite):
                    continue
                prev, following = _neighbours(ops, i)
                key_after = (_kernel(prev), op.phase is Phase.BWD)
                key_before = (_kernel(following), op.phase is Phase.BWD)
                assert op.purpose in sites.get(key_after, ((), ()))[1] or \
                    op.purpose in sites.get(key_before, ((), ()))[0], (name, i, op)
                assert op.kind is op.purpose.kind and op.stream == Stream.COMPUTE
                assert op.group == layout.group(rank, Axis.TP) and op.size_bytes == ACT
                beside = prev if op.purpose in sites.get(key_after, ((), ()))[1] else following
                assert beside is not None and beside.phase is op.phase
                assert beside.layer == op.layer and beside.microbatch == op.microbatch


def test_megatron_f_and_g_without_sp_all_reduce_after_the_row_parallel_kernels():
    ops = _plan("tp").ops[0]
    fwd = [_kernel(_neighbours(ops, i)[0]) for i, op in enumerate(ops)
           if isinstance(op.purpose, TpSite) and op.phase is Phase.FWD]
    assert set(fwd) == {Kernel.EMBED, Kernel.PROJ, Kernel.FC2}
    bwd = [_kernel(_neighbours(ops, i)[0]) for i, op in enumerate(ops)
           if isinstance(op.purpose, TpSite) and op.phase is Phase.BWD]
    assert set(bwd) == {Kernel.QKV, Kernel.FC1, Kernel.LOGITS}


def test_cross_entropy_statistics_follow_logits_and_cross_entropy_forward_in_fp32():
    ops = _plan("tp").ops[0]
    stats = [(i, op) for i, op in enumerate(ops) if isinstance(op.purpose, CrossEntropyStat)]
    num_mb = _layout("tp").num_microbatches
    assert [op.purpose.stat for _, op in stats] == [Stat.MAX, Stat.SUM] * num_mb  # type: ignore[union-attr]
    for i, op in stats:
        before = _kernel(ops[i - 1])
        assert before is (Kernel.LOGITS if op.purpose.stat is Stat.MAX  # type: ignore[union-attr]
                          else Kernel.CROSS_ENTROPY)
        assert op.phase is Phase.FWD and op.dtype == "fp32" and op.kind is OpKind.ALL_REDUCE
        assert op.size_bytes == (1 if op.purpose.stat is Stat.MAX else 2) * 32 * 4  # type: ignore[union-attr]


def test_received_messages_without_sp_are_gathered_right_after_their_receive():
    layout, plan = _layout("tp pp scatter-gather"), _plan("tp pp scatter-gather")
    for rank, ops in plan.ops.items():
        gathers = [(i, op) for i, op in enumerate(ops) if isinstance(op.purpose, MessageGather)]
        recvs = [op for op in ops if op.kind is OpKind.RECV]
        assert len(gathers) == len(recvs) > 0
        for i, op in gathers:
            recv = ops[i - 1]
            assert recv.kind is OpKind.RECV and i - 1 in op.deps
            assert isinstance(recv.purpose, PipeMessage) and \
                (recv.purpose.tag, recv.purpose.boundary) == (op.purpose.tag,  # type: ignore[union-attr]
                                                              op.purpose.boundary)  # type: ignore[union-attr]
            assert op.stream == Stream.COMPUTE and op.group == layout.group(rank, Axis.TP)
            assert op.size_bytes == ACT and i in ops[i + 1].deps  # the first kernel waits
    assert not any(isinstance(op.purpose, MessageGather)
                   for ops in _plan("tp sp pp recompute").ops.values() for op in ops)


def test_pipeline_messages_name_the_boundary_of_the_kernels_they_feed():
    plan = _plan("interleaved")
    for ops in plan.ops.values():
        for i, op in enumerate(ops):
            if not isinstance(op.purpose, PipeMessage):
                continue
            assert str(op.purpose.tag) == op.tag and op.size_bytes == ACT  # tp 1: all of b·s·h
            # a receive feeds (the kernel after it); a send is fed by the kernel before it
            kernel_op = _neighbours(ops, i)[1 if op.kind is OpKind.RECV else 0]
            assert kernel_op is not None and kernel_op.layer is not None
            into = (op.kind is OpKind.RECV) == (op.tag == "act")
            assert op.purpose.boundary == (kernel_op.layer if into else kernel_op.layer + 1)


def test_gradient_buckets_are_reduced_on_dp_after_their_units_once_per_round():
    for name, rounds in (("zero1 buckets", {1}), ("zero2 no overlap", {0, 1}),
                         ("zero0 no overlap", {1})):
        layout, plan = _layout(name), _plan(name)
        for rank, ops in plan.ops.items():
            buckets = [op for op in ops if isinstance(op.purpose, GradBucket)]
            assert {b.purpose.round for b in buckets} == rounds  # type: ignore[union-attr]
            for r in rounds:
                mine = [b for b in buckets if b.purpose.round == r]  # type: ignore[union-attr]
                assert [b.purpose.index for b in mine] == list(range(len(mine))) and \
                    len(mine) > 1  # type: ignore[union-attr]
                assert all(b.microbatch == r for b in mine)
            for b in buckets:
                assert b.stream == Stream.DP and b.group == layout.group(rank, Axis.DP)
                assert b.phase is Phase.BWD and b.kind is (
                    OpKind.ALL_REDUCE if layout.zero == 0 else OpKind.REDUCE_SCATTER)


def test_zero12_gather_each_bucket_after_the_optimizer_and_the_optimizer_waits_for_all():
    layout, plan = _layout("zero1 buckets"), _plan("zero1 buckets")
    for rank, ops in plan.ops.items():
        step = next(i for i, op in enumerate(ops)
                    if op.purpose == KernelRun(Kernel.OPTIMIZER))
        buckets = {op.purpose.index: op for op in ops if isinstance(op.purpose, GradBucket)}  # type: ignore[union-attr]
        gathers = [(i, op) for i, op in enumerate(ops) if isinstance(op.purpose, ParamGather)]
        assert [op.purpose.bucket for _, op in gathers] == sorted(buckets)  # type: ignore[union-attr]
        for i, op in gathers:
            assert i > step and step in op.deps and op.group == layout.group(rank, Axis.DP)
            bucket = buckets[op.purpose.bucket]  # type: ignore[union-attr]
            assert op.size_bytes == bucket.size_bytes  # bf16 gradients and parameters


def test_zero3_gathers_before_each_unit_and_reduce_scatters_after_it():
    layout, plan = _layout("zero3 sp"), _plan("zero3 sp")
    ops = plan.ops[0]
    for i, op in enumerate(ops):
        if isinstance(op.purpose, UnitGather):
            user = next(j for j in range(i + 1, len(ops)) if i in ops[j].deps)
            assert ops[user].kind is OpKind.COMPUTE and op.stream == Stream.ZERO_AG
            assert ops[user].layer == op.purpose.unit.layer
        if isinstance(op.purpose, UnitGradReduce | SpGrads):
            (dep,) = op.deps
            assert ops[dep].kind is OpKind.COMPUTE and ops[dep].phase is Phase.BWD
            assert ops[dep].layer == op.purpose.unit.layer and op.stream == Stream.ZERO_RS
            group = "tp" if isinstance(op.purpose, SpGrads) else "dp"
            assert op.group == layout.group(0, group)
    sp = [op for op in ops if isinstance(op.purpose, SpGrads)]
    reduced = [op for op in ops if isinstance(op.purpose, UnitGradReduce)]
    assert [o.purpose.unit for o in sp] == [o.purpose.unit for o in reduced]  # type: ignore[union-attr]


def test_tied_embedding_gradients_are_all_reduced_between_the_end_stages_before_the_step():
    layout = _layout("tied pp")
    plan = _plan("tied pp")
    for rank, ops in plan.ops.items():
        found = [i for i, op in enumerate(ops) if isinstance(op.purpose, EmbeddingGrads)]
        (i,) = found
        step = next(j for j, op in enumerate(ops) if op.purpose == KernelRun(STEP_KERNELS[1]))
        assert i in ops[step].deps and ops[i].group == layout.embedding_group(rank)
        assert ops[i].stream == Stream.DP
        assert ops[i].size_bytes == MODEL.vocab * MODEL.hidden * 2  # bf16 gradients
    assert dataclasses.replace(MODEL, tied_embeddings=True).tied_embeddings
