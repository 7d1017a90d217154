"""The executor interprets every purpose a plan can hold, by the purpose alone: blanking every
op's name leaves the lowered calls as they were, and a purpose without an interpretation fails
here, not in a run (no torch.distributed needed)."""

from __future__ import annotations

import dataclasses
import functools

import pytest

pytest.importorskip("torch")  # the interpreter binds calls to torch's runtime

from executor.calls import CALLS
from executor.interpreter import bind
from executor.program import lower
from tests.traces.test_purpose import LAYOUTS, MODEL, MOE
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Trace
from traces.plan import build
from traces.purpose import (
    PURPOSES,
    AmaxReduction,
    Bench,
    BenchRole,
    ExpertTp,
    HostCopy,
)

MOE_RUN = {"moe ep sp skewed": dict(tp=2, sp=True, dp=2, ep=2, global_batch=4),
           "moe ep sp zero1": dict(tp=2, sp=True, dp=2, ep=2, zero=1, global_batch=4),
           "moe ep sp zero3": dict(tp=2, sp=True, dp=2, ep=2, zero=3, global_batch=4),
           "moe ep hybridep": dict(dp=2, ep=2, global_batch=4)}
"""MoE layouts the executor runs (routed experts only, skewed: grouped GEMMs in several
ops; ZeRO 1 and 3 over an expert-DP group of 2: the experts' gathers after the step and
per use), beside tests/traces/test_purpose.py's, which use expert TP."""
EXECUTABLE = [name for name in LAYOUTS if name not in ("llama fp8", "cpu offload")
              and not name.startswith("moe")]
EXECUTABLE += list(MOE_RUN)
"""Layouts whose plans hold every purpose but the benchmarks' and FP8's
(tests/traces/test_purpose.py): the executor refuses fp8 (`executor.runtime.fp8_refusal`),
activation offloading's host copies (`executor.options.check_supported`) and expert tensor
parallelism (`executor.options.check_moe_supported`)."""
MOE_ONLY = {ExpertTp}


def _specs(name: str) -> tuple[ModelSpec, Layout]:
    model = MODEL
    if name == "tied pp":
        model = dataclasses.replace(MODEL, tied_embeddings=True)
    if name == "selective unfused":
        model = dataclasses.replace(MODEL, attention="unfused")
    if name in MOE_RUN:
        model = dataclasses.replace(MODEL, **{**MOE, "shared_experts": 0, "routing_skew": 1.0})
        if name == "moe ep hybridep":  # its routing-map gathers
            model = dataclasses.replace(model, dispatch="hybridep")
        return model, Layout(**MOE_RUN[name])
    return model, Layout(**LAYOUTS[name])


def _blank(plan: Trace) -> Trace:
    return dataclasses.replace(plan, ops={r: tuple(dataclasses.replace(op, name="") for op in ops)
                                          for r, ops in plan.ops.items()})


@pytest.mark.parametrize("name", EXECUTABLE)
def test_lowering_reads_purposes_not_names(name):
    model, layout = _specs(name)
    plan = build(model, layout)
    blank = _blank(plan)
    for rank in plan.ops:
        lowered, unnamed = lower(plan, model, layout, rank), lower(blank, model, layout, rank)
        assert unnamed.calls == lowered.calls and unnamed.buckets == lowered.buckets


def test_every_purpose_a_plan_holds_has_a_call_and_every_call_a_runtime_operation():
    seen: dict[type, set[type]] = {}
    for name in EXECUTABLE:
        model, layout = _specs(name)
        plan = build(model, layout)
        for rank, ops in plan.ops.items():
            for op, call in zip(ops, lower(plan, model, layout, rank).calls):
                seen.setdefault(type(op.purpose), set()).add(type(call))
    assert set(seen) == set(PURPOSES) - {Bench, AmaxReduction, HostCopy} - MOE_ONLY
    assert set().union(*seen.values()) == set(CALLS)

    class Runtime:  # every operation a bound call may name, recording it
        def __getattr__(self, method: str):
            if method == "pipe":  # the pipeline messages' own operations (executor.pipe)
                return Runtime()
            return functools.partial(lambda *args: (method, args))

    for call_type in CALLS:
        calls = [c for name in EXECUTABLE for c in _calls(name) if type(c) is call_type]
        bound = bind(Runtime(), calls[0])  # type: ignore[arg-type]
        assert callable(bound)


def _calls(name: str) -> list:
    model, layout = _specs(name)
    plan = build(model, layout)
    return [c for rank in plan.ops for c in lower(plan, model, layout, rank).calls]


def test_a_benchmark_op_in_a_plan_is_refused_before_running():
    model, layout = _specs("tp")
    plan = build(model, layout)
    ops = list(plan.ops[0])
    ops[0] = Op(kind=OpKind.COMPUTE, stream="compute", purpose=Bench(BenchRole.GAP))
    with pytest.raises(ConfigError, match="rank 0 op 0 .*runs in executor.bench"):
        lower(dataclasses.replace(plan, ops={**plan.ops, 0: tuple(ops)}), model, layout, 0)


def test_offload_copies_are_refused_in_one_line():
    """The executor runs no host copies: the run is refused before it starts, and a plan
    holding them fails at its first copy, naming it."""
    from executor.options import check_supported
    model, layout = _specs("cpu offload")
    with pytest.raises(ConfigError, match="cpu_offloading_num_layers: 2: .* simulated, not run"):
        check_supported(model, layout)
    with pytest.raises(ConfigError, match="offload fwd L0 mb0.*simulated, not run"):
        lower(build(model, layout), model, layout, 0)


def test_fsdp2_copy_out_is_a_no_op_call():
    """FSDP2's copy-out (PyTorch's stack at ZeRO 3, `traces.fsdp_kernels`) lowers to the
    gradient store's no-op: the executor's gather already wrote the parameters in place."""
    from executor.calls import GradAccumulate
    from traces.purpose import Kernel, KernelRun

    model = dataclasses.replace(MODEL, kernels="eager")
    layout = Layout(dp=2, zero=3, global_batch=4)
    plan = build(model, layout)
    copies = 0
    for rank, ops in plan.ops.items():
        for op, call in zip(ops, lower(plan, model, layout, rank).calls):
            if op.purpose == KernelRun(Kernel.FSDP_COPY_OUT):
                copies += 1
                assert isinstance(call, GradAccumulate)
    assert copies > 0
