"""Typed purposes: the kernel lists derive from one enumeration, the plan states every op's
purpose, trace files carry them (version 3), and version-2 files get the same purposes back
from their names (traces.legacy, the one place that reads names)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from traces import io
from traces.bench import BenchSpec, bench_plan, probe_grid
from traces.errors import ConfigError
from traces.kernel_groups import FIRST_STAGE, LAST_STAGE
from traces.kernel_groups import layer_kernels as kernel_order
from traces.kernels import embedding_kernels, head_kernels, layer_kernels
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import OpKind, Trace
from traces.plan import build
from traces.purpose import PURPOSES, Bench, GemmChunk, HostCopy, Kernel, KernelRun, Purpose
from traces.purpose_io import TYPES, decode, encode

MODEL = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128)

LAYOUTS = {
    "tp": dict(tp=2, global_batch=2),
    "tp sp pp recompute": dict(tp=2, sp=True, pp=2, recompute="full", global_batch=4),
    "tp pp scatter-gather": dict(tp=2, pp=2, global_batch=4),
    "interleaved": dict(pp=2, vp=2, schedule="interleaved", global_batch=4),
    "zero0 no overlap": dict(dp=2, overlap_grad_reduce=False, bucket_bytes=40_000,
                             global_batch=4),
    "zero1 buckets": dict(dp=2, zero=1, bucket_bytes=40_000, global_batch=4),
    "zero2 no overlap": dict(dp=2, zero=2, overlap_grad_reduce=False, bucket_bytes=40_000,
                             global_batch=4),
    "zero3 sp": dict(tp=2, sp=True, dp=2, zero=3, global_batch=4),
    "zero3 step": dict(dp=2, zero=3, global_batch=8, grad_sync="step"),
    "tied pp": dict(pp=2, dp=2, global_batch=4),
    "selective unfused": dict(tp=2, recompute="selective", global_batch=2),
    "llama fp8": dict(tp=2, dp=2, global_batch=4),
    "cp ring": dict(cp=2, dp=2, recompute="selective", global_batch=2),
    "tp cp gather": dict(tp=2, cp=2, cp_comm="all_gather", global_batch=1),
    "tp comm overlap": dict(tp=2, sp=True, pp=2, recompute="full", global_batch=4,
                            tp_comm_overlap=True),
    "zero2 param gather overlap": dict(dp=2, zero=2, bucket_bytes=40_000, global_batch=4,
                                       overlap_param_gather=True),
    "moe ep etp": dict(tp=2, sp=True, dp=2, ep=2, etp=2, global_batch=4),
    "moe ep zero1": dict(tp=2, sp=True, dp=2, ep=2, zero=1, global_batch=4),
    "moe ep zero3": dict(dp=4, ep=2, zero=3, global_batch=4),
    "moe ep hybridep": dict(dp=2, ep=2, global_batch=4),
    "cpu offload": dict(tp=2, global_batch=2, cpu_offloading_num_layers=2),
}
MOE = dict(ffn="swiglu", ffn_hidden=96, experts=4, top_k=2, moe_ffn_hidden=32,
           shared_experts=1, dense_layers=1)
LLAMA = dict(kv_heads=2, ffn="swiglu", ffn_hidden=96, norm="rmsnorm", position="rope",
             bias=False)
OVERLAPS = {"tp comm overlap", "zero2 param gather overlap"}
"""Layouts version 2 could not write: ops it had no names for (GEMM and collective chunks),
parameter gathers before the forward (version 2 read them as the optimizer's)."""


def _plan(name: str) -> Trace:
    model = MODEL
    if name == "tied pp":
        model = dataclasses.replace(MODEL, tied_embeddings=True)
    if name == "selective unfused":
        model = dataclasses.replace(MODEL, attention="unfused")
    if name == "llama fp8":
        model = dataclasses.replace(MODEL, **LLAMA, dtype="fp8")
    if name.startswith("moe"):
        model = dataclasses.replace(MODEL, **MOE)
    if name == "moe ep hybridep":  # the routing map's gather before each forward dispatch
        model = dataclasses.replace(model, dispatch="hybridep")
    return build(model, Layout(**LAYOUTS[name]))


def _as_version_2(trace: Trace) -> dict:
    """The file a version-2 writer made of `trace`: the same ops, without purposes."""
    data = json.loads(io.dumps(trace))
    data["version"] = 2
    for ops in data["ranks"].values():
        for op in ops:
            op.pop("purpose", None)
    return data


def test_every_kernel_list_derives_from_the_kernel_enumeration():
    for attention in ("flash", "unfused"):
        model = dataclasses.replace(MODEL, attention=attention)
        assert tuple(k.name for k in layer_kernels(model, 1, 2, False)) == \
            kernel_order(attention)
        llama = dataclasses.replace(model, **LLAMA)
        assert tuple(k.name for k in layer_kernels(llama, 1, 2, False)) == \
            kernel_order(attention, rope=True, ffn="swiglu")
    assert tuple(k.name for k in embedding_kernels(MODEL, 1, 1, False)) == FIRST_STAGE
    assert tuple(k.name for k in head_kernels(MODEL, 1, 1, False)) == LAST_STAGE
    from sim.profile import KERNEL_NAMES
    assert tuple(Kernel) == KERNEL_NAMES and Kernel.OPTIMIZER in KERNEL_NAMES


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_op_of_a_plan_states_its_purpose_and_compute_ops_their_kernel(name):
    plan = _plan(name)
    for ops in plan.ops.values():
        for op in ops:
            assert op.purpose is not None, op
            assert isinstance(op.purpose, KernelRun | GemmChunk | HostCopy) == \
                (op.kind is OpKind.COMPUTE)
            if isinstance(op.purpose, KernelRun | GemmChunk):
                assert op.name == op.purpose.kernel  # the label is the kernel's


def test_the_plans_hold_every_purpose_but_the_benchmarks():
    seen = {type(op.purpose) for name in LAYOUTS for ops in _plan(name).ops.values()
            for op in ops}
    assert seen == set(PURPOSES) - {Bench}
    bench = bench_plan(BenchSpec(world=2, sizes=(4096,), probes=probe_grid(
        "fp32", hidden=(64,), seq_len=(32,), micro_batch=(1,)), probe_passes=1))
    assert {type(op.purpose) for ops in bench.ops.values() for op in ops} == {Bench, KernelRun}


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_version_3_file_keeps_every_purpose(name):
    plan = _plan(name)
    back = io.from_json(json.loads(io.dumps(plan)))
    assert back.ops == plan.ops


# Version-2 files predate FP8 (their writer refused dtype "fp8": no amax reduction to recover),
# CP and MoE (no v2 had them) and the overlaps.
@pytest.mark.parametrize("name", sorted(n for n in set(LAYOUTS) - OVERLAPS
                                        if n != "llama fp8" and "cp" not in n
                                        and "moe" not in n))
def test_a_version_2_file_loads_with_the_purposes_of_a_freshly_built_plan(name):
    plan = _plan(name)
    old = io.from_json(_as_version_2(plan))
    assert old.ops == plan.ops


def test_a_version_2_benchmark_loads_with_its_roles():
    plan = bench_plan(BenchSpec(world=2, sizes=(4096, 65536), probes=probe_grid(
        "fp32", hidden=(64,), seq_len=(32,), micro_batch=(1,)), probe_passes=1))
    assert io.from_json(_as_version_2(plan)).ops == plan.ops


def test_an_imported_op_has_no_purpose_and_an_unknown_name_gets_none():
    data = {"schema": "parasim.trace", "version": 2, "ranks": {"0": [
        {"kind": "compute", "stream": "7", "name": "aten::mm"},
        {"kind": "all_reduce", "stream": "comm", "name": "nccl:all_reduce", "group": [0, 1]}]}}
    assert [op.purpose for op in io.from_json(data).ops[0]] == [None, None]


def test_purposes_round_trip_through_their_json_objects():
    purposes = {op.purpose for name in LAYOUTS for ops in _plan(name).ops.values()
                for op in ops}
    for purpose in purposes:
        raw = json.loads(json.dumps(encode(purpose)))  # type: ignore[arg-type]
        assert raw["type"] in TYPES and decode(raw) == purpose


@pytest.mark.parametrize(("raw", "message"), [
    ({"type": "nope"}, r"unknown purpose type 'nope'"),
    ({"type": "kernel"}, r"purpose type 'kernel' needs 'kernel'"),
    ({"type": "kernel", "kernel": "matmul"}, r"kernel: 'matmul' is not one of embed"),
    ({"type": "unit_gather", "unit": -1}, r"unit: a unit is a layer index"),
    ({"type": "grad_bucket", "index": 0, "round": 1, "extra": 2}, r"unknown key 'extra'"),
    ({"type": "tp", "kernel": "qkv", "slot": "a1", "grad": 1, "kind": "all_gather"},
     r"grad: must be true or false"),
    ("kernel", r"must be an object"),
])
def test_a_bad_purpose_is_one_error_naming_the_op(raw, message):
    data = {"schema": "parasim.trace", "version": 3, "ranks": {"0": [
        {"kind": "compute", "stream": "compute", "purpose": raw}]}}
    with pytest.raises(ConfigError, match=r"rank 0, op 0, field 'purpose': " + message):
        io.from_json(data)


def test_a_version_2_file_with_a_purpose_is_refused():
    data = json.loads(io.dumps(_plan("tp")))
    data["version"] = 2
    with pytest.raises(ConfigError, match=r"'purpose' is a field of trace version 3"):
        io.from_json(data)


def test_purpose_is_a_union_of_frozen_values():
    for cls in PURPOSES:
        params = cls.__dataclass_params__
        assert params.frozen and hasattr(cls, "__slots__"), cls
    assert set(Purpose.__args__) == set(PURPOSES)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(OVERLAPS))
def test_a_file_keeps_the_overlaps_layout(name):
    plan = _plan(name)
    back = io.from_json(json.loads(io.dumps(plan)))
    assert back.meta.layout == plan.meta.layout and back.ops == plan.ops
