"""The tensor pass splices each action by a recipe made once per distinct action signature;
its ops equal those of the rule applied node by node (the pass as it was written before)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from traces.layout import Axis, Layout
from traces.mla import down_width
from traces.model import ModelSpec
from traces.ops import Op
from traces.pipeline import build_schedule
from traces.plan.compute import lower_compute
from traces.plan.nodes import Node, Program, RankContext, finalize
from traces.plan.overlap import overlap_region, overlap_template
from traces.plan.tensor import FP32, _fields, _overlapped, _placements, add_tensor_parallel
from traces.purpose import KernelRun

GPT = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128)
MLA = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, kv_lora_rank=16,
                q_lora_rank=24, head_dim=16, qk_rope_head_dim=8, v_head_dim=16, ffn="swiglu",
                ffn_hidden=96, norm="rmsnorm", position="rope", bias=False,
                tied_embeddings=False, attention="flash")


def node_by_node(ctx: RankContext, program: Program) -> Program:
    """The TP pass's rule, node by node: each kernel's inline collectives before and after
    it, an overlapped kernel replaced by its region, whose join the next compute node waits
    for."""
    layout, model = ctx.layout, ctx.local_model
    b, s = layout.micro_batch, model.seq_len
    sizes = {"tp": model.activation_bytes(b), "ce_max": b * s * FP32, "ce_sum": 2 * b * s * FP32,
             "tp_latent": b * s * down_width(model) * model.dtype_bytes}
    group = layout.group(ctx.rank, Axis.TP)
    where = _placements(layout.sp, model.q_lora_rank == 0 if model.mla and layout.sp else None)
    overlap = _overlapped(layout.sp, layout.tp_comm_overlap)
    out: Program = []
    for nodes in program:
        step: list[Node] = []
        join = None
        for node in nodes:
            op = node.op
            key = (op.purpose.kernel, op.phase) if isinstance(op.purpose, KernelRun) else None
            if join is not None and node.on_compute:
                node.wait_for(join)
                join = None
            if key in overlap:
                launch = next(n for n in reversed(step) if n.on_compute)
                region = overlap_region(node, overlap_template(op, *overlap[key], group,
                                                               sizes["tp"]), launch)
                step += region.nodes
                join = region.join
                continue
            before, after = where.get(key, ((), ())) if key is not None else ((), ())
            step += [_inline(ctx, node, c, group, sizes[c[1]]) for c in before]
            step.append(node)
            step += [_inline(ctx, node, c, group, sizes[c[1]]) for c in after]
        assert join is None
        out.append(step)
    return out


def _inline(ctx: RankContext, beside: Node, collective: tuple, group: tuple[int, ...],
            size: float) -> Node:
    op = beside.op
    fields: dict[str, Any] = dict(zip((f.name for f in dataclasses.fields(Op)),
                                      _fields(ctx, collective, group, size), strict=True))
    return Node(Op(**{**fields, "layer": op.layer, "microbatch": op.microbatch,
                      "phase": op.phase}), beside.unit)


def programs(model: ModelSpec, **parallel: Any) -> tuple[RankContext, Program, Program]:
    """A rank's context and two separately lowered copies of its compute program (the passes
    change the nodes they are given)."""
    layout = Layout(**{"global_batch": 4, **parallel})
    ctx = RankContext(model=model, layout=layout, rank=layout.world - 1)
    actions = build_schedule(str(layout.schedule), layout.pp, layout.num_microbatches,
                             layout.vp)[ctx.pp_rank]
    return ctx, lower_compute(ctx, actions), lower_compute(ctx, actions)


LAYOUTS = [
    (GPT, dict(tp=2)),
    (GPT, dict(tp=2, sp=True, recompute="selective")),
    (GPT, dict(tp=4, sp=True, tp_comm_overlap=True, recompute="full")),
    (GPT, dict(tp=2, pp=2, vp=2, schedule="interleaved", sp=True, tp_comm_overlap=True)),
    (MLA, dict(tp=2, sp=True)),
    (MLA, dict(tp=2, sp=True, recompute="full")),
    (MLA, dict(tp=2)),
]


@pytest.mark.parametrize(("model", "parallel"), LAYOUTS)
def test_spliced_actions_equal_the_rule_node_by_node(model, parallel):
    ctx, program, fresh = programs(model, **parallel)
    spliced = finalize(add_tensor_parallel(ctx, program))
    assert len(spliced) > sum(map(len, fresh))  # the pass inserted collectives
    assert spliced == finalize(node_by_node(ctx, fresh))


def test_a_recipe_serves_only_actions_with_its_signature():
    """Two actions of one length but different kernels (a forward and another reversed) each
    get their own collectives; a third like the first reuses its recipe."""
    ctx, program, fresh = programs(GPT, tp=2, sp=True, pp=2)
    assert len(program[0]) == len(program[1]) and program[0][0].op != program[1][-1].op
    spliced = finalize(add_tensor_parallel(ctx, [program[0], program[1][::-1], program[2]]))
    assert spliced == finalize(node_by_node(ctx, [fresh[0], fresh[1][::-1], fresh[2]]))
