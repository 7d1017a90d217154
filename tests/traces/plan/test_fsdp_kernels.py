"""FSDP2's gradient accumulation kernel, its copy-out and PipelineStage's late reduce-scatters
in the plan (traces.fsdp_kernels): one `grad_accum` per unit and backward with the bytes FSDP2's
cast and add move, none where gradients are reduced every micro-batch or by Megatron's
distributed optimizer; under a pipeline every reduce-scatter waits for the stage's last
backward; under PyTorch's stack one `fsdp_copy_out` of twice the gathered bytes per gather."""

from __future__ import annotations

from collections import Counter

import pytest

from traces.errors import ConfigError
from traces.fsdp_kernels import accumulate_bytes
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Phase, Stream
from traces.plan import build
from traces.plan.nodes import RankContext
from traces.purpose import Kernel, KernelRun, Unit, UnitGather, UnitGradReduce

SMALL = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, dtype="bf16")
M = 4  # micro-batches: global_batch 8 over dp 2
ACCUM = KernelRun(Kernel.GRAD_ACCUM)


def zero3(**options: object) -> Layout:
    return Layout(dp=2, zero=3, global_batch=2 * M, **options)  # type: ignore[arg-type]


def accums(ops: tuple[Op, ...]) -> Counter[tuple[int | None, int | None]]:
    """grad_accum ops by (layer, micro-batch)."""
    return Counter((op.layer, op.microbatch) for op in ops if op.purpose == ACCUM)


def test_accumulation_bytes_are_fsdp2s_cast_then_adds() -> None:
    # bf16 parameters, fp32 reduce: cast 2 + 4 bytes, then read 4 + 2, write 4
    assert accumulate_bytes(10.0, 2, 4, first=True) == 60.0
    assert accumulate_bytes(10.0, 2, 4, first=False) == 100.0
    # one dtype: autograd keeps the first gradient, then read, read, write
    assert accumulate_bytes(10.0, 2, 2, first=True) == 0.0
    assert accumulate_bytes(10.0, 2, 2, first=False) == 60.0


def test_fp32_reduce_accumulates_every_unit_in_every_backward() -> None:
    layout = zero3(grad_sync="step", fp32_main_grads=True)
    ops = build(SMALL, layout).ops[0]
    ctx = RankContext(model=SMALL, layout=layout, rank=0)
    layers = range(SMALL.layers)
    expected = {(layer, mb): 1 for layer in layers for mb in range(M)}
    expected |= {(None, mb): 2 for mb in range(M)}  # the embedding and the output layer
    assert accums(ops) == Counter(expected)
    params = ctx.unit_params(Unit.of_layer(0))
    sizes = {op.microbatch: op.mem_bytes for op in ops if op.purpose == ACCUM and op.layer == 0}
    assert sizes == {0: params * 6, 1: params * 10, 2: params * 10, 3: params * 10}
    assert all(op.kind is OpKind.COMPUTE and op.phase is Phase.BWD for op in ops
               if op.purpose == ACCUM)


def test_one_dtype_accumulates_from_the_second_backward() -> None:
    ops = build(SMALL, zero3(grad_sync="step")).ops[0]
    assert set(mb for _, mb in accums(ops)) == {1, 2, 3}


def test_reduce_scatter_waits_for_the_units_accumulation() -> None:
    ops = build(SMALL, zero3(grad_sync="step", fp32_main_grads=True)).ops[0]
    for op in ops:
        if isinstance(op.purpose, UnitGradReduce) and op.layer is not None:
            waited = [ops[i] for i in op.deps]
            assert any(w.purpose == ACCUM and w.layer == op.layer for w in waited)


@pytest.mark.parametrize("layout", [
    zero3(fp32_main_grads=True),  # reduced every micro-batch: nothing accumulated
    Layout(dp=2, zero=2, global_batch=2 * M, grad_sync="step", fp32_main_grads=True),
    Layout(dp=2, zero=1, global_batch=2 * M, fp32_main_grads=True),
    Layout(dp=1, zero=3, global_batch=M, grad_sync="step", fp32_main_grads=True),
], ids=["zero3-microbatch", "zero2-step", "zero1", "dp1"])
def test_no_accumulation_kernel_elsewhere(layout: Layout) -> None:
    assert not any(op.purpose == ACCUM for ops in build(SMALL, layout).ops.values()
                   for op in ops)


@pytest.mark.parametrize("options", [dict(pp=2), dict(pp=2, vp=2, schedule="interleaved")],
                         ids=["1f1b", "interleaved"])
def test_pipeline_reduce_scatters_wait_for_the_stages_last_backward(options: dict) -> None:
    """PipelineStage's run_post_backward: every unit's reduce-scatter after the stage's whole
    last backward, not right after the unit's own gradients."""
    layout = zero3(grad_sync="step", reshard_after_forward=False, **options)
    plan = build(SMALL, layout)
    for rank, ops in plan.ops.items():
        for op in ops:
            if not isinstance(op.purpose, UnitGradReduce):
                continue
            waited = [ops[i] for i in op.deps]
            # the stage's last backward ends with its first layer's (or embedding's) ops
            last = max(i for i, o in enumerate(ops) if o.kind is OpKind.COMPUTE
                       and o.phase is Phase.BWD and o.microbatch == M - 1
                       and i < ops.index(op))
            assert ops[last] in waited, (rank, op.name, op.layer)


def test_without_a_pipeline_reduce_scatters_follow_each_unit() -> None:
    ops = build(SMALL, zero3(grad_sync="step")).ops[0]
    reduces = [i for i, op in enumerate(ops) if isinstance(op.purpose, UnitGradReduce)]
    last_bwd = max(i for i, op in enumerate(ops) if op.kind is OpKind.COMPUTE
                   and op.phase is Phase.BWD)
    assert min(max(ops[i].deps) for i in reduces) < last_bwd  # the first starts early


# --- FSDP2's copy-out after every gather (PyTorch's stack) ----------------------------------

EAGER = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, dtype="bf16",
                  kernels="eager")
COPY_OUT = KernelRun(Kernel.FSDP_COPY_OUT)


def gathers_and_copies(ops: tuple[Op, ...]) -> list[tuple[Op, Op]]:
    """Each dense unit gather with the copy-out that waits for it."""
    pairs = []
    for op in ops:
        if op.purpose == COPY_OUT:
            (gather,) = [ops[i] for i in op.deps if isinstance(ops[i].purpose, UnitGather)]
            pairs.append((gather, op))
    return pairs


@pytest.mark.parametrize("kernels", ["eager", "compiled"])
def test_every_gather_is_copied_out_reading_and_writing_its_bytes(kernels: str) -> None:
    model = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, dtype="bf16",
                      kernels=kernels)
    ops = build(model, zero3(fp32_main_grads=True)).ops[0]
    gathers = [op for op in ops if isinstance(op.purpose, UnitGather)]
    pairs = gathers_and_copies(ops)
    assert len(pairs) == len(gathers) == 2 * M * (model.layers + 2)  # fwd + bwd, every unit
    ctx = RankContext(model=model, layout=zero3(fp32_main_grads=True), rank=0)
    for gather, copy in pairs:
        assert copy.mem_bytes == 2 * gather.size_bytes
        assert copy.kind is OpKind.COMPUTE and copy.stream is Stream.COMPUTE
        assert (copy.layer, copy.microbatch, copy.phase) == \
            (gather.layer, gather.microbatch, gather.phase)
    layer0 = [c for g, c in pairs if g.layer == 0]
    assert {c.mem_bytes for c in layer0} == {2 * 2 * ctx.unit_params(Unit.of_layer(0))}


def test_a_units_first_op_waits_for_its_copy_out() -> None:
    ops = build(EAGER, zero3()).ops[0]
    for i, op in enumerate(ops):
        if op.purpose == COPY_OUT:
            nxt = next(o for o in ops[i + 1:] if o.stream is Stream.COMPUTE)
            assert i in nxt.deps and nxt.layer == op.layer


def test_kept_gathered_under_a_pipeline_copies_out_once_a_step() -> None:
    """reshard_after_forward false under PP: one gather, so one copy-out, per unit a step."""
    layout = zero3(grad_sync="step", reshard_after_forward=False, pp=2)
    for ops in build(EAGER, layout).ops.values():
        copies = Counter(op.layer for op in ops if op.purpose == COPY_OUT)
        gathers = Counter(op.layer for op in ops if isinstance(op.purpose, UnitGather))
        assert copies == gathers and set(copies.values()) == {1}


@pytest.mark.parametrize("layout", [zero3(), Layout(dp=2, zero=2, global_batch=2 * M)],
                         ids=["fused-zero3", "eager-zero2"])
def test_no_copy_out_outside_fsdp2(layout: Layout) -> None:
    model = SMALL if layout.zero == 3 else EAGER  # Megatron's stack, or no ZeRO-3 gathers
    assert not any(op.purpose == COPY_OUT for ops in build(model, layout).ops.values()
                   for op in ops)


# --- FSDP2's reduce-scatter copy-in before every reduce-scatter (PyTorch's stack) -----------

COPY_IN = KernelRun(Kernel.FSDP_RS_COPY_IN)


def reduces_and_copies(ops: tuple[Op, ...]) -> list[tuple[Op, Op]]:
    """Each unit's reduce-scatter with the copy-in it waits for."""
    pairs = []
    for op in ops:
        if isinstance(op.purpose, UnitGradReduce):
            (copy,) = [ops[i] for i in op.deps if ops[i].purpose == COPY_IN]
            pairs.append((op, copy))
    return pairs


@pytest.mark.parametrize(("options", "held"), [({}, 2), ({"grad_sync": "step"}, 4)],
                         ids=["per-microbatch", "accumulated-fp32"])
def test_every_reduce_scatter_waits_for_its_copy_in_of_grad_plus_reduce_bytes(
        options: dict[str, object], held: int) -> None:
    """bf16 gradients cast into an fp32 reduce-scatter input: 2 + 4 bytes a parameter; where
    FSDP2 accumulated them across micro-batches they are fp32 already: 4 + 4."""
    layout = zero3(fp32_main_grads=True, **options)
    ops = build(EAGER, layout).ops[0]
    ctx = RankContext(model=EAGER, layout=layout, rank=0)
    pairs = reduces_and_copies(ops)
    assert len(pairs) == len([op for op in ops if isinstance(op.purpose, UnitGradReduce)]) > 0
    for reduce, copy in pairs:
        assert copy.kind is OpKind.COMPUTE and copy.stream is Stream.COMPUTE
        assert (copy.layer, copy.microbatch, copy.phase) == \
            (reduce.layer, reduce.microbatch, Phase.BWD)
        assert copy.mem_bytes == reduce.size_bytes / 4 * (held + 4)
    layer0 = {c.mem_bytes for r, c in pairs if r.layer == 0}
    assert layer0 == {ctx.unit_params(Unit.of_layer(0)) * (held + 4)}


def test_a_copy_in_follows_its_units_backward_on_the_compute_stream() -> None:
    ops = build(EAGER, zero3()).ops[0]
    for op in ops:
        if op.purpose == COPY_IN:
            before = max(op.deps)
            assert ops[before].stream is Stream.COMPUTE and ops[before].layer == op.layer
            assert ops[before].phase is Phase.BWD


def test_no_copy_in_under_megatrons_stack() -> None:
    assert not any(op.purpose == COPY_IN for ops in build(SMALL, zero3()).ops.values()
                   for op in ops)


# --- Megatron-FSDP without gradient_accumulation_fusion: main_grad.copy_ per unit ------------

def test_megatron_fsdp_without_fusion_copies_each_units_grads_once_a_microbatch() -> None:
    """Megatron's stack (SMALL, kernels "fused"): bf16 `param.grad` copied into the bf16
    main-gradient bucket, 2 + 2 bytes a parameter, before every unit's reduce-scatter in every
    micro-batch (Megatron-FSDP reduces every backward)."""
    layout = zero3(gradient_accumulation_fusion=False)
    ops = build(SMALL, layout).ops[0]
    ctx = RankContext(model=SMALL, layout=layout, rank=0)
    pairs = reduces_and_copies(ops)
    reduces = [op for op in ops if isinstance(op.purpose, UnitGradReduce)]
    assert len(pairs) == len(reduces) == (SMALL.layers + 2) * M
    for reduce, copy in pairs:
        assert copy.stream is Stream.COMPUTE and copy.microbatch == reduce.microbatch
        assert copy.mem_bytes == reduce.size_bytes / 2 * (2 + 2)
    assert {c.mem_bytes for r, c in pairs if r.layer == 0} == \
        {ctx.unit_params(Unit.of_layer(0)) * 4}


def test_fusion_off_only_under_megatron_fsdp() -> None:
    with pytest.raises(ConfigError, match="gradient_accumulation_fusion"):
        Layout(dp=2, zero=1, global_batch=2 * M, gradient_accumulation_fusion=False)


def test_fusion_off_adds_nothing_to_fsdp2s_own_copy_in() -> None:
    """PyTorch's stack copies in anyway: the key changes no op there."""
    on, off = (build(EAGER, zero3(gradient_accumulation_fusion=flag)).ops[0]
               for flag in (True, False))
    assert [(op.name, op.mem_bytes) for op in on] == [(op.name, op.mem_bytes) for op in off]
