"""Each pass of the plan builder alone, on tiny layouts: exactly the ops it adds, and where."""

from __future__ import annotations

import dataclasses

import pytest

from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase, Stream
from traces.pipeline import build_schedule
from traces.plan.compute import lower_compute
from traces.plan.data import add_data_parallel
from traces.plan.nodes import Node, Program, RankContext, finalize
from traces.plan.optimizer import add_optimizer
from traces.plan.p2p import add_pipeline_p2p
from traces.plan.tensor import add_tensor_parallel
from traces.purpose import HEAD as HEAD_UNIT
from traces.purpose import Unit

MODEL = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128)
ACT = 1 * 32 * 64 * 2  # b*s*h in bf16


def setup(rank: int = 0, **parallel: object) -> tuple[RankContext, list, Program]:
    layout = Layout(**{"global_batch": 2, **parallel})
    ctx = RankContext(model=MODEL, layout=layout, rank=rank)
    actions = build_schedule(str(layout.schedule), layout.pp, layout.num_microbatches,
                             layout.vp)[ctx.pp_rank]
    return ctx, actions, lower_compute(ctx, actions)


def names(nodes: list[Node]) -> list[str]:
    return [n.op.name or str(n.op.kind) for n in nodes]


def added(before: Program, after: Program) -> list[list[Node]]:
    """Per step, the nodes a pass inserted."""
    return [[n for n in step if all(n is not m for m in old)] for old, step in zip(before, after)]


LAYER = ["ln1", "qkv", "flash_attn", "proj", "bda1", "ln2", "fc1", "gelu", "fc2", "bda2"]
UNFUSED_CORE = ["qk", "softmax", "attn_dropout", "av"]
HEAD = ["final_ln", "logits", "cross_entropy"]


def test_compute_pass_lowers_each_action_to_its_stage_kernels_in_run_order():
    ctx, actions, program = setup(pp=2, global_batch=2)
    assert [str(a) for a in actions] == ["0F0", "0F1", "0B0", "0B1"]
    assert len(program) == len(actions) + 1 and program[-1] == []
    assert names(program[0]) == ["embed", "pos_embed", *LAYER, *LAYER]  # layers 0 and 1
    assert names(program[2]) == [*LAYER[::-1], *LAYER[::-1], "pos_embed", "embed"]
    assert [n.op.layer for n in program[2]] == [1] * 10 + [0] * 10 + [None] * 2
    assert [str(n.unit) for n in program[2]][-3:] == ["L0", "embed", "embed"]
    assert all(n.op.microbatch == 1 for n in program[1])
    qkv = program[0][3].op
    assert qkv.gemm == (1, 32, 3 * 64, 64) and qkv.flops == 2 * 32 * 3 * 64 * 64
    assert program[2][-4].op.name == "qkv" and program[2][-4].op.flops == 2 * qkv.flops
    assert all(n.op.stream == Stream.COMPUTE and not n.after for step in program for n in step)
    _, _, last = setup(rank=1, pp=2, global_batch=2)
    assert names(last[0])[-3:] == HEAD and names(last[1])[:3] == HEAD[::-1]


def test_compute_pass_recomputes_the_layer_first_or_the_core_where_backward_meets_it():
    unfused = dataclasses.replace(MODEL, attention="unfused")
    _, _, full = setup(recompute="full")
    backward = full[1]  # pp = 1: F0, B0, F1, B1
    assert names(backward)[:3 + 20] == HEAD[::-1] + LAYER + LAYER[::-1]
    assert {n.op.phase for n in backward[3:13]} == {Phase.RECOMPUTE}
    layout = Layout(recompute="selective", global_batch=2)
    ctx = RankContext(model=unfused, layout=layout, rank=0)
    selective = lower_compute(ctx, build_schedule("1f1b", 1, 2)[0])[1]
    core_backward = UNFUSED_CORE[::-1]
    expected = ["bda2", "fc2", "gelu", "fc1", "ln2", "bda1", "proj", *UNFUSED_CORE,
                *core_backward, "qkv", "ln1"]
    assert names(selective)[3:3 + len(expected)] == expected
    recomputed = [n.op for n in selective if n.op.phase is Phase.RECOMPUTE]
    assert sum(op.flops for op in recomputed) == 4 * 32 * 32 * 64 * MODEL.layers  # 4bs²h


@pytest.mark.parametrize("sp", [False, True])
def test_tensor_pass_adds_megatron_f_and_g_collectives(sp):
    ctx, _, program = setup(tp=2, sp=sp, global_batch=1)  # pp = 1: F0, B0
    before = [list(step) for step in program]
    after = add_tensor_parallel(ctx, program)
    new = added(before, after)
    forward, backward = names(after[0]), names(after[1])
    tp = "tp"
    if sp:
        assert forward[:6] == ["embed", tp, "pos_embed", "ln1", tp, "qkv"]
        assert [n.op.kind for n in new[0][:2]] == [OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER]
        # backward: qkv, fc1 and logits all-gather their saved input shard again first
        assert backward[:6] == ["cross_entropy", tp, "logits", tp, "final_ln", "bda2"]
        assert backward[-8:] == ["flash_attn", tp, "qkv", tp, "ln1", "pos_embed", tp, "embed"]
        assert names(after[1])[names(after[1]).index("gelu"):][:5] == [
            "gelu", tp, "fc1", tp, "ln2"]
        per_layer_fwd = 4  # gather before qkv and fc1, scatter after proj and fc2
        # in backward order: gather before fc2 (gradient), before fc1 (its input), scatter
        # after it; the same for proj, qkv
        per_layer_bwd = [OpKind.ALL_GATHER, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER] * 2
        head_bwd = [OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER]
    else:
        assert forward[:4] == ["embed", tp, "pos_embed", "ln1"]
        assert backward[:5] == ["cross_entropy", "logits", tp, "final_ln", "bda2"]
        assert backward[-3:] == ["ln1", "pos_embed", "embed"]
        per_layer_fwd = 2  # all-reduce after proj and fc2
        per_layer_bwd = [OpKind.ALL_REDUCE, OpKind.ALL_REDUCE]  # after fc1 and qkv
        head_bwd = [OpKind.ALL_REDUCE]
    layer_ops = [n for n in new[0] if n.op.layer == 0]
    assert len(layer_ops) == per_layer_fwd
    assert [n.op.kind for n in new[1] if n.op.layer == 0] == per_layer_bwd
    assert [n.op.kind for n in new[1] if n.unit == HEAD_UNIT and n.op.name == tp] == head_bwd
    assert all(n.op.group == (0, 1) and n.on_compute for step in new for n in step)
    ce = [n.op for n in new[0] if n.op.name.startswith("ce_")]
    assert [(op.name, op.size_bytes, op.dtype) for op in ce] == [
        ("ce_max", 32 * 4, "fp32"), ("ce_sum", 2 * 32 * 4, "fp32")]
    assert all(n.op.size_bytes == ACT for step in new for n in step if n.op.name == "tp")
    assert forward[-4:] == ["logits", "ce_max", "cross_entropy", "ce_sum"]


def test_tensor_pass_is_the_identity_without_tensor_parallelism():
    ctx, _, program = setup()
    assert add_tensor_parallel(ctx, program) is program


def test_p2p_pass_receives_first_sends_last_and_blocks_on_the_previous_send():
    ctx, actions, program = setup(rank=1, pp=2, global_batch=2)  # last stage: F0 B0 F1 B1
    assert [str(a) for a in actions] == ["1F0", "1B0", "1F1", "1B1"]
    out = add_pipeline_p2p(ctx, actions, program)
    f0, b0, f1, b1 = out[:4]
    assert (f0[0].op.kind, f0[0].op.stream, f0[0].op.peer, f0[0].op.tag) == (
        OpKind.RECV, Stream.RECV_PREV, 0, "act")
    assert f0[1].after == [f0[0]]  # the first layer waits for its input
    assert all(n.op.kind is not OpKind.SEND for n in f0)  # the last stage sends nothing on
    send = b0[-1]
    assert (send.op.kind, send.op.stream, send.op.peer, send.op.tag) == (
        OpKind.SEND, Stream.SEND_PREV, 0, "grad")
    assert send.after == [b0[-2]] and send.op.size_bytes == ACT
    assert f1[0].op.kind is OpKind.RECV and f1[1].after == [send, f1[0]]
    assert b1[0].op.name == "cross_entropy" and not b1[0].after  # F1 sent nothing to wait for
    assert b1[-1].op.kind is OpKind.SEND


@pytest.mark.parametrize("overlap", [True, False])
def test_interleaved_p2p_blocks_the_next_action_of_its_direction_with_overlap_p2p_comm(overlap):
    """Megatron-Core's overlap_p2p_comm (its default under interleaving): a forward's send
    holds back the next forward's first kernel, not the backward between them, and a
    backward's the next backward's; without it every send blocks the very next action."""
    ctx, actions, program = setup(rank=0, pp=2, vp=2, schedule="interleaved",
                                  global_batch=4, overlap_p2p_comm=overlap)
    out = add_pipeline_p2p(ctx, actions, program)
    sends: dict[str, Node] = {}
    previous = None  # the send of the action before
    checked = set()
    for action, step in zip(actions, out):
        first = next(n for n in step if n.on_compute)
        waits = [n for n in first.after if n.op.kind is OpKind.SEND]
        expected = sends.get(action.kind) if overlap else previous
        assert waits == ([expected] if expected is not None else []), str(action)
        if expected is not None and previous is not None and expected is not previous:
            checked.add(action.kind)  # the case the two rules tell apart
        previous = next((n for n in step if n.op.kind is OpKind.SEND), None)
        if previous is not None:
            sends[action.kind] = previous
        elif overlap:
            sends.pop(action.kind, None)
    assert checked == ({"F", "B"} if overlap else set())


def test_data_pass_reduces_buckets_in_the_last_micro_batch_only_for_zero_0():
    ctx, actions, program = setup(dp=2, global_batch=4)  # two micro-batches per replica
    out = add_data_parallel(ctx, actions, program)
    reductions = [(k, n) for k, step in enumerate(out) for n in step
                  if n.op.stream == Stream.DP]
    assert {k for k, _ in reductions} == {3}  # F0 B0 F1 B1: only B1 reduces
    total = sum(n.op.size_bytes for _, n in reductions)
    params = MODEL.layers * MODEL.layer_params() + MODEL.embedding_params() + 2 * MODEL.hidden
    assert total == params * 2  # every gradient, once, in bf16
    assert all(n.op.kind is OpKind.ALL_REDUCE and n.op.group == (0, 1) for _, n in reductions)


def test_data_pass_zero3_gathers_before_each_unit_and_scatters_after_its_backward():
    ctx, actions, program = setup(dp=2, zero=3, global_batch=2)  # F0 B0
    out = add_data_parallel(ctx, actions, program)
    forward, backward = out[0], out[1]
    gathers = [n for n in forward if n.op.stream == Stream.ZERO_AG]
    assert [str(n.unit) for n in gathers] == ["embed", "L0", "L1", "L2", "L3", "head"]
    layer2 = next(n for n in forward
                  if n.op.stream == Stream.ZERO_AG and n.unit == Unit.of_layer(2))
    layer0 = [n for n in forward if n.on_compute and n.unit == Unit.of_layer(0)]
    assert layer2.after == [layer0[-1]] and layer0[-1].op.name == "bda2"
    scatters = [n for n in backward if n.op.stream == Stream.ZERO_RS]
    assert [str(n.unit) for n in scatters] == ["head", "L3", "L2", "L1", "L0", "embed"]
    assert scatters[1].op.size_bytes == MODEL.layer_params() * 2
    unit_first = next(n for n in backward if n.on_compute and n.unit == Unit.of_layer(3))
    assert unit_first.after[-1].op.stream == Stream.ZERO_AG


def test_optimizer_pass_waits_for_reductions_and_zero1_gathers_the_same_buckets():
    ctx, actions, program = setup(dp=2, zero=1, global_batch=2)
    program = add_data_parallel(ctx, actions, program)
    out = add_optimizer(ctx, program)
    end = out[-1]
    # the step's end: the norm, its all-reduce over every rank (ZeRO shards the gradients),
    # the clip's scale, the optimizer, then the gathers
    assert [n.op.name for n in end[:4]] == ["grad_norm", "norm", "grad_clip", "optimizer"]
    first, step = end[0], end[3]
    assert all(n.op.phase is Phase.OPT for n in end)
    scatters = [n for s in out[:-1] for n in s if n.op.stream == Stream.DP]
    assert first.after == [scatters[-1]]
    assert [n.after for n in end[1:4]] == [[end[0]], [end[1]], [end[2]]]
    params = MODEL.params_on_stages(ctx.layout.stages_of_rank(0), ctx.layout.num_stages,
                                    ctx.layout.tp)
    # bf16 with bf16 gradients: the norm reads 4, the clip reads and writes 4; the optimizer:
    # to fp32 (2 + 4), Adam 28, back to bf16 (4 + 2), zero 2
    assert [n.op.mem_bytes for n in end[:4]] == [params / 2 * 4, 0.0, params / 2 * 8,
                                                 params / 2 * 42]
    assert (end[1].op.kind, end[1].op.group, end[1].op.size_bytes, end[1].op.dtype) == \
        (OpKind.ALL_REDUCE, (0, 1), 4.0, "fp32")
    gathers = end[4:]
    assert [n.op.size_bytes for n in gathers] == [n.op.size_bytes for n in scatters]
    assert all(n.op.kind is OpKind.ALL_GATHER and n.after == [step] for n in gathers)


@pytest.mark.parametrize("sp", [False, True])
def test_p2p_pass_sends_one_tp_share_and_gathers_it_after_receiving_without_sp(sp):
    ctx, actions, program = setup(rank=2, tp=2, pp=2, sp=sp, global_batch=1)  # 1F0 1B0
    program = add_tensor_parallel(ctx, program)
    before = [list(step) for step in program]
    out = add_pipeline_p2p(ctx, actions, program)
    f0, b0 = (step for step in added(before, out)[:2])
    recv, send = f0[0], b0[-1]
    assert (recv.op.kind, recv.op.size_bytes, recv.op.layer) == (OpKind.RECV, ACT / 2, 2)
    assert (send.op.kind, send.op.size_bytes, send.op.layer) == (OpKind.SEND, ACT / 2, 2)
    if sp:  # the activation is the rank's sequence shard already
        assert names(f0) == ["recv"] and names(b0) == ["send"]
        assert out[0][1].op.name == "ln1" and out[0][1].after == [recv]
        return
    gather = f0[1]
    assert names(f0) == ["recv", "tp"] and names(b0) == ["send"]  # the last stage sends back
    assert (gather.op.kind, gather.op.stream, gather.op.group, gather.op.size_bytes,
            gather.op.phase, gather.op.microbatch) == (
        OpKind.ALL_GATHER, Stream.COMPUTE, (2, 3), ACT, Phase.FWD, 0)
    assert gather.after == [recv] and gather.unit is None
    assert out[0][:3] == [recv, gather, out[0][2]] and out[0][2].op.name == "ln1"
    assert out[0][2].after == [gather]
    # the first stage gathers the gradient it receives before its backward
    ctx0, actions0, program0 = setup(rank=0, tp=2, pp=2, sp=sp, global_batch=1)
    out0 = add_pipeline_p2p(ctx0, actions0, program0)
    b0_first = out0[1]
    assert names(b0_first)[:3] == ["recv", "tp", "bda2"]
    assert b0_first[0].op.tag == "grad" and b0_first[0].op.layer == 1
    assert b0_first[1].op.phase is Phase.BWD and b0_first[1].after == [out0[0][-1],
                                                                        b0_first[0]]


def test_finalize_numbers_nodes_in_order_and_turns_waits_into_deps():
    ctx, actions, program = setup(pp=2, rank=1)
    ops = finalize(add_pipeline_p2p(ctx, actions, program))
    recv = next(i for i, op in enumerate(ops) if op.kind is OpKind.RECV)
    assert ops[recv + 1].deps == (recv,)
    assert all(d < i for i, op in enumerate(ops) for d in op.deps)


def _summary(node: Node) -> tuple:
    op = node.op
    return (op.name, op.kind, op.stream, op.group, op.size_bytes, op.dtype, op.layer,
            op.microbatch, op.phase, [(w.op.name, w.op.layer) for w in node.after])


def test_data_pass_zero2_adds_exactly_one_reduce_scatter_per_bucket_in_every_backward():
    # Gradients in bf16, backward order: head 128 params (the final norm; the output layer
    # is the tied embedding) = 256 B, each layer 12h² + 13h = 49,984 params = 99,968 B, the
    # embedding 128·64 + 32·64 = 10,240 params = 20,480 B. Buckets of 150,000 B close at
    # head + 3 + 2 = 200,192 B, 1 + 0 = 199,936 B, and the embedding (its chunk's end).
    ctx, actions, program = setup(dp=2, zero=2, global_batch=4, bucket_bytes=150_000)
    assert [str(a) for a in actions] == ["0F0", "0B0", "0F1", "0B1"]
    before = [list(step) for step in program]
    out = add_data_parallel(ctx, actions, program)
    new = added(before, out)
    assert new[0] == new[2] == new[4] == []  # forwards and the step's end: nothing
    rs, dp, bwd = OpKind.REDUCE_SCATTER, Stream.DP, Phase.BWD
    for mb, step in ((0, 1), (1, 3)):  # ZeRO-2: every micro-batch's backward reduces
        assert [_summary(n) for n in new[step]] == [
            ("grads", rs, dp, (0, 1), 200_192.0, "bf16", None, mb, bwd, [("ln1", 2)]),
            ("grads", rs, dp, (0, 1), 199_936.0, "bf16", None, mb, bwd, [("ln1", 0)]),
            ("grads", rs, dp, (0, 1), 20_480.0, "bf16", None, mb, bwd, [("embed", None)]),
        ]
        # each right after the op it waits for, the compute ops untouched and in order
        for node in new[step]:
            assert out[step][out[step].index(node) - 1] is node.after[0]
        assert [n for n in out[step] if all(n is not m for m in new[step])] == before[step]
    assert MODEL.params_on_stages(ctx.layout.stages_of_rank(0), ctx.layout.num_stages,
                                  ctx.layout.tp) * 2 == 200_192 + 199_936 + 20_480


def test_optimizer_pass_zero2_adds_exactly_the_step_and_one_gather_per_last_bucket():
    ctx, actions, program = setup(dp=2, zero=2, global_batch=4, bucket_bytes=150_000)
    program = add_data_parallel(ctx, actions, program)
    before = [list(step) for step in program]
    out = add_optimizer(ctx, program)
    new = added(before, out)
    assert new[:-1] == [[], [], [], []]  # only the step's end grows (pp = 1: no tied all-reduce)
    last_bucket = program[3][-1]  # micro-batch 1's embedding bucket, the last DP op
    assert _summary(last_bucket)[:2] == ("grads", OpKind.REDUCE_SCATTER)
    ag, dp, opt = OpKind.ALL_GATHER, Stream.DP, Phase.OPT
    c, ar = OpKind.COMPUTE, OpKind.ALL_REDUCE
    assert [_summary(n) for n in new[-1]] == [
        ("grad_norm", c, Stream.COMPUTE, (), 0.0, "bf16", None, None, opt, [("grads", None)]),
        ("norm", ar, Stream.COMPUTE, (0, 1), 4.0, "fp32", None, None, opt,
         [("grad_norm", None)]),
        ("grad_clip", c, Stream.COMPUTE, (), 0.0, "bf16", None, None, opt, [("norm", None)]),
        ("optimizer", c, Stream.COMPUTE, (), 0.0, "bf16", None, None, opt,
         [("grad_clip", None)]),
        # the updated bf16 parameters, in the slices micro-batch 1 reduce-scattered
        ("params", ag, dp, (0, 1), 200_192.0, "bf16", None, None, opt, [("optimizer", None)]),
        ("params", ag, dp, (0, 1), 199_936.0, "bf16", None, None, opt, [("optimizer", None)]),
        ("params", ag, dp, (0, 1), 20_480.0, "bf16", None, None, opt, [("optimizer", None)]),
    ]
    assert new[-1][0].after == [last_bucket]
    step = new[-1][3]
    # 210,304 params / dp 2 each moving 42 B (to fp32 2 + 4, Adam 28, back 4 + 2, zero 2)
    assert step.op.mem_bytes == 210_304 / 2 * 42 and step.op.flops == 0.0


def test_inline_communication_is_exactly_the_tensor_parallel_pass_and_the_pipeline_gathers():
    """Op.inline (what the report's TP lane and validation's 'tp' family read) holds for
    the collectives the TP/SP pass and the pipeline's after-receive gathers put on the
    compute stream, the step end's gradient statistic, and for nothing the data-parallel or
    pipeline passes put elsewhere."""
    from traces.layout import Layout
    from traces.model import ModelSpec
    from traces.ops import OpKind, Stream
    from traces.plan import build
    from traces.purpose import GradStat

    model = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128)
    layout = Layout(tp=2, pp=2, dp=2, sp=True, global_batch=8)
    plan = build(model, layout)
    for ops in plan.ops.values():
        inline = [op for op in ops if op.inline]
        assert inline and all(op.kind.is_collective and op.stream == Stream.COMPUTE
                              and (len(op.group) == layout.tp
                                   or isinstance(op.purpose, GradStat)) for op in inline)
        # the step end's statistic (bf16: the norm only), over every rank (ZeRO 0: TP x PP)
        stats = [op for op in inline if isinstance(op.purpose, GradStat)]
        assert [len(op.group) for op in stats] == [layout.tp * layout.pp]
        assert not any(op.inline for op in ops if op.kind is OpKind.COMPUTE
                       or op.stream != Stream.COMPUTE)
