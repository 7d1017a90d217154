"""Program lowering reads what the plan says, from each op's purpose: the stage boundary of a
send or receive, the unit of an SP gradient all-reduce, and the all-gather of a received
message's TP chunks (no torch.distributed needed)."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")  # the executor runs on torch

from executor.calls import GatherReceived, SpAllReduce, Transfer
from executor.program import Call, lower
from tests.executor.workers import Case
from traces.errors import ConfigError
from traces.ops import OpKind
from traces.plan import build


def _lowered(case: Case, rank: int) -> list[tuple[str, Call]]:
    model, layout = case.specs()
    plan = build(model, layout)
    calls = lower(plan, model, layout, rank).calls
    return [(str(op.kind), call) for op, call in zip(plan.ops[rank], calls)]


def test_pipeline_messages_and_their_gathers_are_placed_by_layer_and_receive():
    # 4 layers on 4 virtual stages of 2 ranks (rank = tp + 2·pp): rank 2 runs stages 1 and 3
    case = Case(dict(tp=2, pp=2, vp=2, schedule="interleaved", global_batch=4),
                model=dict(layers=4))
    calls = [(kind, call) for kind, call in _lowered(case, 2)
             if isinstance(call, Transfer | GatherReceived)]

    def short(kind: str, call: Call) -> tuple:
        method = "gather_received" if isinstance(call, GatherReceived) else \
            "send" if call.send else "recv"  # type: ignore[union-attr]
        return (kind, method, (call.boundary, call.mb, str(call.tag)))  # type: ignore[union-attr]

    by_mb = [short(kind, call) for kind, call in calls if call.mb == 0]
    # stage 1 (layer 1): activation in, then out to stage 2; stage 3 (layer 3): in, no out;
    # backward: gradient of stage 1's output in, of its input back
    assert by_mb == [
        ("recv", "recv", (1, 0, "act")), ("all_gather", "gather_received", (1, 0, "act")),
        ("send", "send", (2, 0, "act")),
        ("recv", "recv", (3, 0, "act")), ("all_gather", "gather_received", (3, 0, "act")),
        ("send", "send", (3, 0, "grad")),
        ("recv", "recv", (2, 0, "grad")), ("all_gather", "gather_received", (2, 0, "grad")),
        ("send", "send", (1, 0, "grad")),
    ]
    sp = Case({**case.layout, "sp": True}, model=case.model)
    assert not any(isinstance(call, GatherReceived) for _, call in _lowered(sp, 2))


def test_sp_grads_name_their_unit():
    case = Case(dict(tp=2, sp=True, dp=2, global_batch=2))  # 2 layers
    units = [str(call.unit) for _, call in _lowered(case, 0) if isinstance(call, SpAllReduce)]
    assert units == ["head", "L1", "L0", "embed"]


def test_a_send_without_its_purpose_is_rejected_before_running():
    case = Case(dict(pp=2, global_batch=2))
    model, layout = case.specs()
    plan = build(model, layout)
    ops = list(plan.ops[0])
    at = next(i for i, op in enumerate(ops) if op.kind is OpKind.SEND)
    ops[at] = dataclasses.replace(ops[at], purpose=None)
    broken = dataclasses.replace(plan, ops={**plan.ops, 0: tuple(ops)})
    with pytest.raises(ConfigError, match=f"rank 0 op {at} .*without a purpose"):
        lower(broken, model, layout, 0)
