"""Each pass of the plan builder alone, on tiny layouts: exactly the ops it adds, and where."""

from __future__ import annotations

import pytest

from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase, Stream
from traces.pipeline import build_schedule
from traces.plan.compute import lower_compute
from traces.plan.data import add_data_parallel
from traces.plan.nodes import Node, Program, RankContext, finalize
from traces.plan.optimizer import ADAM_BYTES_PER_PARAM, add_optimizer
from traces.plan.p2p import add_pipeline_p2p
from traces.plan.tensor import add_tensor_parallel

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


def test_compute_pass_lowers_each_action_to_its_stage_ops_in_run_order():
    ctx, actions, program = setup(pp=2, global_batch=2)
    assert [str(a) for a in actions] == ["0F0", "0F1", "0B0", "0B1"]
    assert len(program) == len(actions) + 1 and program[-1] == []
    block = ["attn", "mlp", "norm"]
    assert names(program[0]) == ["embed", *block, *block]  # stage 0 holds layers 0 and 1
    assert names(program[2]) == [*block[::-1], *block[::-1], "embed"]
    assert [n.op.layer for n in program[2]] == [1, 1, 1, 0, 0, 0, None]
    assert [n.unit for n in program[2]] == [1, 1, 1, 0, 0, 0, "embed"]
    assert all(n.op.microbatch == 1 for n in program[1])
    attn = program[0][1].op
    assert attn.flops == MODEL.attn_flops(1) and program[2][2].op.flops == 2 * MODEL.attn_flops(1)
    assert all(n.op.stream == Stream.COMPUTE and not n.after for step in program for n in step)


def test_compute_pass_puts_recomputation_right_before_each_layer_backward():
    _, _, full = setup(recompute="full")
    _, _, selective = setup(recompute="selective")
    backward = names(full[1])  # pp = 1: F0, B0, F1, B1
    assert backward[:7] == ["head", "attn", "mlp", "norm", "norm", "mlp", "attn"]
    assert [n.op.phase for n in full[1][1:4]] == [Phase.RECOMPUTE] * 3
    assert names(selective[1])[:5] == ["head", "attn_core", "norm", "mlp", "attn"]
    assert selective[1][1].op.flops == MODEL.attn_core_flops(1)


@pytest.mark.parametrize("sp", [False, True])
def test_tensor_pass_adds_one_collective_after_each_block_and_a_gather_before_with_sp(sp):
    ctx, _, program = setup(tp=2, sp=sp)
    before = [list(step) for step in program]
    after = add_tensor_parallel(ctx, program)
    new = added(before, after)
    blocks = MODEL.layers * 2  # attention and MLP per layer
    assert len(new[0]) == blocks * (2 if sp else 1)
    kinds = [n.op.kind for n in new[0]]
    if sp:
        assert kinds == [OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER] * blocks
    else:
        assert kinds == [OpKind.ALL_REDUCE] * blocks
    assert all(n.op.group == (0, 1) and n.op.size_bytes == ACT and n.on_compute for n in new[0])
    first = after[0][1:4] if not sp else after[0][1:5]  # after the embedding
    expected = ["all_gather", "attn", "reduce_scatter"] if sp else ["attn", "all_reduce"]
    assert names(first)[:len(expected)] == expected


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
    assert b1[0].op.name == "head" and b1[0].after == []  # F1 sent nothing: nothing to wait for
    assert b1[-1].op.kind is OpKind.SEND


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
    assert [n.unit for n in gathers] == ["embed", 0, 1, 2, 3, "head"]
    layer2 = next(n for n in forward if n.op.stream == Stream.ZERO_AG and n.unit == 2)
    assert layer2.after == [next(n for n in forward if n.op.name == "norm" and n.unit == 0)]
    scatters = [n for n in backward if n.op.stream == Stream.ZERO_RS]
    assert [n.unit for n in scatters] == ["head", 3, 2, 1, 0, "embed"]
    assert scatters[1].op.size_bytes == MODEL.layer_params() * 2
    unit_first = next(n for n in backward if n.on_compute and n.unit == 3)
    assert unit_first.after[-1].op.stream == Stream.ZERO_AG


def test_optimizer_pass_waits_for_reductions_and_zero1_gathers_the_same_buckets():
    ctx, actions, program = setup(dp=2, zero=1, global_batch=2)
    program = add_data_parallel(ctx, actions, program)
    out = add_optimizer(ctx, program)
    end = out[-1]
    step = end[0]
    assert step.op.name == "optimizer" and step.op.phase is Phase.OPT
    scatters = [n for s in out[:-1] for n in s if n.op.stream == Stream.DP]
    assert step.after == [scatters[-1]]
    params = ctx.layout.params_on_rank(MODEL, 0)
    assert step.op.mem_bytes == params / 2 * ADAM_BYTES_PER_PARAM
    assert [n.op.size_bytes for n in end[1:]] == [n.op.size_bytes for n in scatters]
    assert all(n.op.kind is OpKind.ALL_GATHER and n.after == [step] for n in end[1:])


def test_finalize_numbers_nodes_in_order_and_turns_waits_into_deps():
    ctx, actions, program = setup(pp=2, rank=1)
    ops = finalize(add_pipeline_p2p(ctx, actions, program))
    recv = next(i for i, op in enumerate(ops) if op.kind is OpKind.RECV)
    assert ops[recv + 1].deps == (recv,)
    assert all(d < i for i, op in enumerate(ops) for d in op.deps)
