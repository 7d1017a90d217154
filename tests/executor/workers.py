"""Functions that run inside spawned ranks (importable, so the fork server can start them).

Each takes the RankContext first and loops over several cases in one world, as the CI budget
asks; results go back to the test process, which checks them against the reference.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

import executor.recorder as recording
from executor.comm import Comm
from executor.groups import Groups, layout_group_keys, plan_group_keys
from executor.interpreter import Interpreter
from executor.launch import RankContext
from executor.optim import AdamWConfig
from executor.options import RunOptions
from executor.params import build_unit_params
from executor.recorder import DONE, H_OFFSET, Recorder, measure_clocks, new_buffer
from executor.runtime import RankRuntime
from tests.executor.drive import Step, _kernels
from traces.chrome import event_name
from traces.kernel_groups import layer_kernels
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Phase, Trace
from traces.plan import build
from traces.purpose import Stat, Unit

SMALL = dict(layers=2, hidden=32, heads=4, seq_len=16, vocab=64, dtype="fp32")
LLAMA = dict(kv_heads=2, ffn="swiglu", ffn_hidden=48, norm="rmsnorm", position="rope",
             bias=False, dropout=0.0)
"""SMALL as a Llama block: GQA (2 key/value heads of 4), SwiGLU, RMSNorm, RoPE, no biases,
no dropout (so its unfused plans run no attn_dropout)."""
QWEN3 = dict(LLAMA, head_dim=12, qk_norm=True)
"""SMALL as a Qwen3 block: LLAMA's with heads of 12 (a query of 4 x 12 = 48 on hidden 32,
as Qwen3-32B's 64 x 128 = 8192 on 5120) normalized per head before RoPE (issue 32)."""
MLA = dict(kv_lora_rank=12, q_lora_rank=16, head_dim=6, qk_rope_head_dim=4, v_head_dim=10,
           ffn="swiglu", ffn_hidden=48, norm="rmsnorm", position="rope", bias=False)
"""SMALL with latent attention (issue 19): 4 heads of 6 + 4 rope dims, values of 10, c_KV of
12, c_q of 16 (q_lora_rank 0: the query projected directly)."""
# eps well above the gradients' rounding noise: AdamW is then smooth in the gradient (an update
# moves by at most lr/eps times a gradient's error), so parameters after two steps show any
# gradient error, a uniform scale included, instead of the sign flips of near-zero gradients.
ADAMW = AdamWConfig(eps=1e-4)
OPTIONS = RunOptions(adamw=ADAMW)


@dataclass(frozen=True, slots=True)
class Case:
    """One configuration to train for `steps` steps."""

    layout: dict[str, Any]
    model: dict[str, Any] = field(default_factory=dict)
    steps: int = 2
    sp_after: bool = False
    record: bool = False
    gpus_per_node: int = 8
    """The emulated node of a DeepEP/HybridEP dispatch (`RunOptions.gpus_per_node`)."""

    def specs(self) -> tuple[ModelSpec, Layout]:
        return ModelSpec(**{**SMALL, **self.model}), Layout(**self.layout)


def _runtime(ctx: RankContext, case: Case, record: bool = False
             ) -> tuple[RankRuntime, Groups]:
    model, layout = case.specs()
    groups = Groups.create(layout_group_keys(layout), ctx.timeout_s)
    rt = RankRuntime(model, layout, ctx.rank, Comm(groups, record), OPTIONS, ctx.device)
    return rt, groups


def train_cases(ctx: RankContext, cases: list[Case]) -> list[dict[str, Any]]:
    """Per case: losses per step, reduced gradients of step 1, parameters after the steps,
    and (when recorded) the communication calls of the steps."""
    out = []
    for case in cases:
        rt, groups = _runtime(ctx, case, case.record)
        losses, grads = [], None
        start = time.perf_counter()
        for _ in range(case.steps):
            step = Step(rt, case.sp_after)
            losses.append(step.run())
            grads = grads if grads is not None else step.reduced_grads
        seconds = time.perf_counter() - start
        calls = list(rt.comm.calls)
        rt.comm.record = False
        params = {unit: rt.unit_params(unit) for unit in rt.flat.units}
        out.append({"losses": losses, "grads": grads, "segments": segments(rt),
                    "params": params, "calls": calls,
                    "peak": rt.meter.peak_bytes, "seconds": seconds,
                    "coords": rt.layout.coords(ctx.rank)})
        groups.destroy()
    return out


def segments(rt: RankRuntime) -> list[tuple[int, int]]:
    """The flat ranges the optimizer's gradient segments cover."""
    if rt.grads.shards is None:
        return [(b.start, b.end) for b in rt.buckets]
    return list(rt.grads.shards.flat_slice)


def layer_case(ctx: RankContext, case: Case, seed: int) -> dict[str, Any]:
    """One layer forward and backward on given input and output gradient (the same full
    tensors on every rank; SP ranks take their sequence shard); the activation bytes the
    forward leaves for the backward (`held`, with the data's `data`) and those left after it."""
    rt, groups = _runtime(ctx, case)
    model, layout = rt.model, rt.layout
    gen = torch.Generator().manual_seed(seed)
    shape = (model.seq_len, layout.micro_batch, model.hidden)
    x, gy = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    if layout.sp:
        x, gy = (t.chunk(layout.tp)[rt.tp_rank].clone() for t in (x, gy))
    tape = rt.tape(0)
    tape.put((0, "x"), x)
    kernels = layer_kernels(model.attention, rope=model.position == "rope", ffn=model.ffn,
                            mla=model.mla, qk_norm=model.qk_norm)
    _kernels(rt, kernels, Phase.FWD, 0, 0)
    held = rt.meter.live["activations"]  # what the forward leaves for the backward
    y = tape.acts[(1, "x")].clone()
    tape.release((1, "x"))
    tape.put_grad((1, "x"), gy)
    _kernels(rt, kernels[::-1], Phase.BWD, 0, 0)
    gx = tape.take_grad((0, "x"))
    if layout.sp:
        rt.sp_grads(Unit.of_layer(0), async_op=False)
    assert rt.grads.full is not None
    grads = {}
    for spec in rt.flat.specs[Unit.of_layer(0)]:
        lo, hi = rt.flat.param_range[(Unit.of_layer(0), spec.name)]
        grads[spec.name] = rt.grads.full[lo:hi].view(spec.shape).clone()
    groups.destroy()
    data = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in (tape.acts[("D", "tokens")], tape.acts[("D", "targets")])}
    return {"y": y, "gx": gx, "grads": grads, "tp_rank": rt.tp_rank, "held": held,
            "data": sum(data.values()), "left": rt.meter.live["activations"],
            "slots": sorted(tape.acts)}


def ce_case(ctx: RankContext, case: Case, seed: int) -> dict[str, Any]:
    """Vocab-parallel cross-entropy on given full logits and targets."""
    rt, groups = _runtime(ctx, case)
    model, layout = rt.model, rt.layout
    gen = torch.Generator().manual_seed(seed)
    s, b, V = model.seq_len, layout.micro_batch, model.vocab
    logits = torch.randn((s, b, V), generator=gen) * 3
    targets = torch.randint(0, V, (s, b), generator=gen)
    shard = logits.chunk(layout.tp, dim=-1)[rt.tp_rank].contiguous()
    tape = rt.tape(0)
    tape.put(("D", "targets"), targets)
    tape.put(("H", "logits"), shard)
    tape.put(("H", "lmax"), shard.amax(dim=-1))
    if layout.tp > 1:
        rt.ce_collective(Stat.MAX, 0)
    rt.compute("cross_entropy", Phase.FWD, None, 0)
    if layout.tp > 1:
        rt.ce_collective(Stat.SUM, 0)
    rt.compute("cross_entropy", Phase.BWD, None, 0)
    out = {"loss": rt.losses[0], "glogits": tape.take_grad(("H", "logits")),
           "scale": rt.loss_scale, "tp_rank": rt.tp_rank}
    groups.destroy()
    return out


def zero_case(ctx: RankContext, case: Case) -> dict[str, Any]:
    """Round trips: ZeRO-3 gather/free/gather of every unit equals the unit built whole;
    ZeRO-1/2 bucket all-gather spreads each rank's slice; a gradient reduce-scatter sums."""
    rt, groups = _runtime(ctx, case)
    out: dict[str, Any] = {"dp_rank": rt.dp_rank}
    if rt.zero == 3:
        diffs, freed = [], []
        for unit in rt.flat.units:
            whole = build_unit_params(rt.model, rt.layout, unit, rt.pp_rank, rt.tp_rank,
                                      rt.options.seed)
            for _ in range(2):
                rt.gather_unit(unit, async_op=False)
                diffs.append(float((rt.params.units[unit].flat - whole).abs().max()))
                rt.params.free_unit(unit)
                freed.append(rt.params.units[unit].flat.untyped_storage().nbytes())
        out.update(diffs=diffs, freed=freed)
    else:
        assert rt.params.shards is not None and rt.params.full is not None
        for lo, hi in rt.params.shards.flat_slice:
            rt.params.full[lo:hi] = float(rt.dp_rank + 1)
        for handle in [rt.gather_bucket(b.index) for b in rt.buckets]:
            handle.wait()
        out["full"] = rt.params.full.clone()
        out["slices"] = [(b.start, b.end) for b in rt.buckets]
    # Every unit's gradient is (dp rank + 1): the reduced slice is 1 + 2 + ... + dp.
    for unit in rt.flat.units:
        for spec in rt.flat.specs[unit]:
            rt.grads.accumulate(unit, spec.name, torch.full(spec.shape, rt.dp_rank + 1.0))
    for handle in [rt.reduce_bucket(b.index) for b in rt.buckets]:
        handle.wait()
    out["reduced"] = [g.clone() for g in rt.grads.optimizer_grads()]
    groups.destroy()
    return out


def clock_case(ctx: RankContext) -> tuple[int, int, str]:
    return measure_clocks(ctx.rank, ctx.world_size, ctx.device)


def clock_hosts_case(ctx: RankContext) -> tuple[int, int, str]:
    """measure_clocks as if every rank were on a host of its own (the ping-pong branch)."""
    real = recording.host_key
    recording.host_key = lambda: 1000 + ctx.rank
    try:
        return recording.measure_clocks(ctx.rank, ctx.world_size, ctx.device)
    finally:
        recording.host_key = real


def suite(ctx: RankContext, tasks: list[tuple[str, tuple]]) -> list[Any]:
    """Run several tasks (names of functions here, with their arguments) in one world."""
    return [globals()[name](ctx, *args) for name, args in tasks]


def walk_plan(ctx: RankContext, plan: Trace, fail_at: int | None = None,
              how: str = "raise") -> list[Any]:
    """Run the plan's communication for real (tensors of the planned sizes, on the planned
    groups and streams) and a small matmul per compute op, each op waited on before the next,
    recording every op; at op `fail_at` on rank 1, raise (or die, or hang)."""
    layout = plan.meta.layout
    groups = Groups.create(plan_group_keys(plan, layout), ctx.timeout_s)
    comm = Comm(groups, record=True)
    offset, _, _ = measure_clocks(ctx.rank, ctx.world_size, ctx.device)
    ctx.records[H_OFFSET] = offset
    rec = Recorder(ctx.records)
    rec.reset()
    a = torch.randn(64, 64)
    for index, op in enumerate(plan.ops[ctx.rank]):
        rec.begin(index)
        if ctx.rank == 1 and index == fail_at:
            if how == "die":
                os._exit(3)
            if how == "hang":
                time.sleep(3600)
            error = ValueError("injected fault")
            error.parasim_op = f"op {index} ({event_name(op)})"  # type: ignore[attr-defined]
            raise error
        if op.kind is OpKind.COMPUTE:
            a = torch.tanh(a @ a)
        else:
            _communicate(comm, op)
        rec.end(index)
    rec.set_state(DONE)
    groups.destroy()
    return comm.calls


def _communicate(comm: Comm, op: Op) -> None:
    n = int(op.size_bytes) // 4  # fp32 elements of the planned buffer
    key = (op.stream, op.group)
    if op.kind is OpKind.ALL_REDUCE:
        comm.all_reduce(torch.ones(n), key)
    elif op.kind is OpKind.REDUCE_SCATTER:
        comm.reduce_scatter(torch.empty(n // len(op.group)), torch.ones(n), key)
    elif op.kind is OpKind.ALL_GATHER:
        comm.all_gather(torch.empty(n), torch.ones(n // len(op.group)), key)
    elif op.kind is OpKind.SEND:
        assert op.peer is not None
        comm.send(torch.ones(n), op.peer, op.tag).wait()
    elif op.kind is OpKind.RECV:
        assert op.peer is not None
        comm.recv(torch.empty(n), op.peer, op.tag).wait()
    else:
        raise AssertionError(f"the walker does not run {op.kind}")


def hang(ctx: RankContext, pid_file: str) -> None:
    """Write this rank's pid, then wait forever (for the Ctrl-C and timeout tests)."""
    with open(f"{pid_file}.{ctx.rank}", "w") as out:
        out.write(str(os.getpid()))
    time.sleep(3600)


def interpret_cases(ctx: RankContext, cases: list[Case], count_flops: bool = False
                    ) -> list[dict[str, Any]]:
    """Per case: the plan interpreter runs `steps` steps of the real plan; losses, parameters
    after the steps, the first step's calls, the last step's records, and (when asked) the
    FLOPs torch.utils.flop_counter saw in each op of the first step."""
    out = []
    for case in cases:
        model, layout = case.specs()
        plan = build(model, layout)
        groups = Groups.create(plan_group_keys(plan, layout), ctx.timeout_s)
        comm = Comm(groups, record=True)
        records = new_buffer(len(plan.ops[ctx.rank]))
        records[H_OFFSET] = measure_clocks(ctx.rank, ctx.world_size, ctx.device)[0]
        recorder = Recorder(records)
        options = dataclasses.replace(OPTIONS, gpus_per_node=case.gpus_per_node)
        interp = Interpreter(plan, model, layout, ctx.rank, comm, options, ctx.device, recorder)
        flops: list[float] = [0.0] * len(interp.calls)
        if count_flops:
            interp.calls = [_counting(call, flops, i) for i, call in enumerate(interp.calls)]
        losses = []
        for _ in range(case.steps):
            recorder.reset()
            interp.step()
            comm.record = False
            interp.calls = [getattr(c, "inner", c) for c in interp.calls]
            losses.append(dict(interp.runtime.losses))
            interp.runtime.losses.clear()
        recorder.set_state(DONE)
        rt = interp.runtime
        params = {unit: rt.unit_params(unit) for unit in rt.flat.units}
        out.append({"losses": losses, "params": params, "calls": comm.calls,
                    "records": records.copy(), "flops": flops, "grad_norm": rt.grad_norm,
                    "coords": layout.coords(ctx.rank), "live": dict(rt.meter.live)})
        groups.destroy()
    return out


def _counting(call: Any, flops: list[float], index: int) -> Any:
    """`call`, its FLOPs stored at its op's index (ops on other streams are issued as they
    become ready, not in index order)."""

    def counted() -> Any:
        with FlopCounterMode(display=False) as mode:
            result = call()
        flops[index] = float(mode.get_total_flops())
        return result
    counted.inner = call  # type: ignore[attr-defined]
    return counted


def device_case(ctx: RankContext, case: Case) -> dict[str, Any]:
    """The plan interpreter on this rank's device (NCCL on GPUs), recorded as `executor.run`
    records: per step the CUDA events pending at the flush, the interpreter's peak memory
    beside torch.cuda.max_memory_allocated and the meter's own count; losses and parameters
    (on the CPU) after the steps."""
    model, layout = case.specs()
    plan = build(model, layout)
    groups = Groups.create(plan_group_keys(plan, layout), ctx.timeout_s)
    comm = Comm(groups)
    records = new_buffer(len(plan.ops[ctx.rank]))
    records[H_OFFSET] = measure_clocks(ctx.rank, ctx.world_size, ctx.device)[0]
    recorder = Recorder(records, ctx.device)
    flush, events = recorder.flush, []

    def counted_flush() -> None:
        events.append(len(recorder._events))
        flush()

    recorder.flush = counted_flush  # type: ignore[method-assign]
    interp = Interpreter(plan, model, layout, ctx.rank, comm, OPTIONS, ctx.device, recorder)
    losses, peaks = [], []
    for _ in range(case.steps):
        recorder.reset()
        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        interp.runtime.meter.reset_peak()
        interp.step()
        losses.append(dict(interp.runtime.losses))
        interp.runtime.losses.clear()
        max_allocated = torch.cuda.max_memory_allocated() if ctx.device.type == "cuda" else -1
        peaks.append((interp.peak_bytes(), max_allocated, interp.runtime.meter.peak_bytes))
    recorder.set_state(DONE)
    rt = interp.runtime
    params = {unit: {name: t.cpu() for name, t in rt.unit_params(unit).items()}
              for unit in rt.flat.units}
    groups.destroy()
    return {"backend": ctx.backend, "device": str(ctx.device), "events": events,
            "num_ops": len(plan.ops[ctx.rank]), "peaks": peaks, "losses": losses,
            "params": params, "records": records.copy(), "coords": layout.coords(ctx.rank)}
