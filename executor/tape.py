"""Per-micro-batch activations and the autograd state between one kernel's forward and its
backward, so that every kernel of the plan runs — and is timed — as its own call.

A kernel's forward reads its input slots, cut from any graph, and runs with autograd on; the
state it leaves (`Saved`) is exactly what its backward needs, and the backward is one engine
call on the gradients of its outputs that returns the gradients of its inputs (into the tape)
and of its parameters (to the caller, who adds them to the gradient buffer). Memory follows
PyTorch's own rules: an input is kept only if autograd saved it (inputs enter through
`_Source`, which saves nothing), an output's storage lives on in the tape's slot, not in the
graph (Megatron-LM's `deallocate_output_tensor`).

Recomputation (`Recompute`): `full` runs a layer's forward kernels without saving anything and
keeps only the layer input; `selective` does so for the attention core and keeps its input
(the QKV output). The recompute phase then re-runs those kernels with saving on.

Sequence parallelism: the column-parallel GEMMs (qkv, fc1, logits) read an input that a `tp`
all-gather assembled from the sequence shards, and keep only the shard (in the slot
`shard_slot(key)`), as Megatron-LM's sequence-parallel linear does: autograd's saved copy of
the gathered input is replaced by a reference to its slot (a saved-tensor hook), the slot is
released after the forward, and before the backward the `tp` all-gather refills it from the
shard, which the backward then reads (for the weight gradient) and releases with the shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.autograd import Variable

from executor.kernels import KERNELS, KernelContext, Slot, TorchKernel, slot
from executor.memory import MemoryMeter
from traces.kernel_groups import CORE_KERNELS, LAYER_KERNELS
from traces.layout import Layout, Recompute
from traces.ops import Phase
from traces.purpose import Kernel, Unit
from traces.zero_bubble import WEIGHT_GEMMS, splits_backward

ParamRef = tuple[Unit, str]
"""(unit, parameter name)."""
NON_DIFFERENTIABLE = frozenset({"tokens", "targets", "lmax"})

# Inputs a kernel is the last forward user of: their slots are released after it runs.
RELEASE_AFTER: dict[str, tuple[str, ...]] = {
    "qkv": ("a1",), "rope": ("qkv_raw", "q_raw", "kv", "latn"), "flash_attn": ("qkv",),
    "softmax": ("scores",), "qk_norm": ("qkv_n",),
    "attn_dropout": ("probs",), "av": ("probs_d", "qkv"), "proj": ("ctx",),
    "bda1": ("attn", "x"), "fc1": ("a2",), "gelu": ("h1",), "swiglu": ("h1",), "fc2": ("h2",),
    "bda2": ("mlp", "y"), "pos_embed": ("emb",),
    "latent_norm": ("lat",), "q_up": ("a1",),
    "final_ln": ("xL",), "logits": ("fln",), "cross_entropy": ("logits", "lmax"),
    # MoE (executor.moe); expert_fc1 reads perm itself with EP 1
    "topk": ("logits",), "aux_loss": ("scores",), "permute": ("a2",),
    "expert_fc1": ("recv", "perm"), "expert_act": ("eh1",), "expert_fc2": ("eh2",),
    "unpermute": ("back", "gates"),
}
# What forward keeps for the recompute phase, and what the recompute phase throws away (its
# consumers are not re-run).
KEPT_FOR_RECOMPUTE = {Recompute.NONE: frozenset(), Recompute.FULL: frozenset({"x"}),
                      Recompute.SELECTIVE: frozenset({"qkv"})}
DROPPED_IN_RECOMPUTE = {Recompute.NONE: frozenset(), Recompute.FULL: frozenset({"x+"}),
                        Recompute.SELECTIVE: frozenset({"ctx"})}
# Kernels whose input, with SP, is gathered from sequence shards before the forward and
# gathered again before the backward (only the shard is kept in between).
GATHERED_INPUT = {"qkv": "a1", "fc1": "a2", "logits": "fln"}


def shard_slot(key: Slot) -> Slot:
    """Where the sequence shard of a gathered input waits for the backward."""
    return (key[0], f"{key[1]}/shard")


def recomputed(kernel: Kernel, recompute: Recompute) -> bool:
    """Whether forward skips saving `kernel`'s state because the recompute phase re-runs it."""
    if recompute is Recompute.FULL:
        return kernel in LAYER_KERNELS
    return recompute is Recompute.SELECTIVE and kernel in CORE_KERNELS


class _Source(torch.autograd.Function):
    """Where a kernel's input enters its graph: saves nothing, hands its gradient to `sink`."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, x: torch.Tensor, sink: list) -> torch.Tensor:  # type: ignore[override]
        ctx.sink = sink
        return x.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, None, None]:  # type: ignore[override]
        ctx.sink.append(grad)
        return None, None, None


@dataclass(slots=True)
class Saved:
    """One kernel application's autograd state, from its forward to its backward."""

    anchor: torch.Tensor | None
    sources: list[tuple[Slot, list]]
    outputs: list[tuple[Slot, torch.Tensor]]
    params: list[tuple[ParamRef, torch.Tensor]]
    held: list[int]
    gathered: Slot | None = None
    """SP: the slot of the gathered input the backward reads (refilled by a `tp` all-gather
    from `shard_slot(gathered)`), released with its shard after the backward."""


@dataclass(frozen=True, slots=True)
class _SlotRef:
    """What autograd saves instead of a gathered input: where to find it at backward time,
    and the view of it the kernel saved."""

    tape: Tape
    key: Slot
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    def unpack(self) -> torch.Tensor:
        value = self.tape.acts.get(self.key)
        if value is None:
            raise RuntimeError(f"backward needs slot {self.key}: its tp all-gather has not run")
        return value.as_strided(self.size, self.stride, self.offset)


class Tape:
    """One micro-batch: activation slots, gradient slots, and saved kernel states."""

    def __init__(self, meter: MemoryMeter, num_layers: int,
                 kernels: dict[Kernel, TorchKernel] = KERNELS) -> None:
        self.meter, self.num_layers = meter, num_layers
        self.kernels = kernels
        """The model's torch kernels (`executor.kernels.table_of`)."""
        self.acts: dict[Slot, torch.Tensor] = {}
        self.grads: dict[Slot, torch.Tensor] = {}
        self.saved: dict[tuple[Kernel, int | None], Saved] = {}
        self.deferred: dict[tuple[Kernel, int | None], _Deferred] = {}
        """A split backward's B ran, its W has not: the graph and its output gradients."""
        self._held: dict[tuple[str, Slot], int] = {}
        self.loss: torch.Tensor | None = None

    # --- slots ---------------------------------------------------------------------------

    def put(self, key: Slot, value: torch.Tensor) -> None:
        self._set("a", self.acts, key, value)

    def take(self, key: Slot) -> torch.Tensor:
        return self._pop("a", self.acts, key)

    def release(self, key: Slot) -> None:
        if key in self.acts:
            self._pop("a", self.acts, key)

    def put_grad(self, key: Slot, value: torch.Tensor) -> None:
        """Add to the slot's gradient (a tensor used by two kernels gets two)."""
        if key in self.grads:
            self.grads[key] = self.grads[key] + value
            self.meter.drop(self._held.pop(("g", key)))
            self._held[("g", key)] = self.meter.hold(self.grads[key], "activations")
        else:
            self._set("g", self.grads, key, value)

    def take_grad(self, key: Slot) -> torch.Tensor:
        if key not in self.grads:
            raise RuntimeError(f"no gradient for slot {key}: its consumers' backward has not run")
        return self._pop("g", self.grads, key)

    def replace_grad(self, key: Slot, value: torch.Tensor) -> None:
        self._pop("g", self.grads, key)
        self._set("g", self.grads, key, value)

    def _set(self, tag: str, table: dict, key: Slot, value: torch.Tensor) -> None:
        if key in table:
            self._pop(tag, table, key)
        table[key] = value
        self._held[(tag, key)] = self.meter.hold(value, "activations")

    def _pop(self, tag: str, table: dict, key: Slot) -> torch.Tensor:
        value = table.pop(key)
        self.meter.drop(self._held.pop((tag, key)))
        return value

    def clear(self) -> None:
        """Drop everything (end of a step, or a failed one)."""
        for key in list(self.acts):
            self.release(key)
        for key in list(self.grads):
            self._pop("g", self.grads, key)
        for state in [*self.saved.values(), *(d.state for d in self.deferred.values())]:
            for ptr in state.held:
                self.meter.drop(ptr)
        self.saved.clear()
        self.deferred.clear()


# --- running one kernel ----------------------------------------------------------------------

def forward(tape: Tape, name: Kernel, layer: int | None, ctx: KernelContext,
            params: Sequence[tuple[ParamRef, torch.Tensor]], *, save: bool,
            recompute: Recompute, recomputing: bool = False) -> None:
    """Run kernel `name` forward on its input slots and put its outputs in the tape.

    `save`: keep the autograd state for its backward. `recomputing`: this is the recompute
    phase (outputs whose consumers are not re-run are dropped at once)."""
    kernel = tape.kernels[name]
    in_keys = [slot(kernel, n, layer, tape.num_layers) for n in kernel.inputs]
    out_keys = [slot(kernel, n, layer, tape.num_layers) for n in kernel.outputs]
    inputs = [tape.acts[k] for k in in_keys]
    gathered = None
    if name in GATHERED_INPUT:
        key = slot(kernel, GATHERED_INPUT[name], layer, tape.num_layers)
        gathered = key if shard_slot(key) in tape.acts else None
    if save:
        state, outputs = _forward_saving(tape, kernel, in_keys, out_keys, inputs, ctx, params,
                                         gathered)
        saved_key = (name, layer)
        if saved_key in tape.saved:  # a recompute replaces what the forward saved
            for ptr in tape.saved.pop(saved_key).held:
                tape.meter.drop(ptr)
        tape.saved[saved_key] = state
    else:
        with torch.no_grad():
            outputs = list(kernel.fn(ctx, *inputs, *(p for _, p in params)))
    kept = KEPT_FOR_RECOMPUTE[recompute] if not recomputing else frozenset()
    dropped = DROPPED_IN_RECOMPUTE[recompute] if recomputing else frozenset()
    for out_name, out_key, value in zip(kernel.outputs, out_keys, outputs):
        if out_name not in dropped:
            tape.put(out_key, value)
    for in_name in RELEASE_AFTER.get(name, ()):
        if in_name not in kept:
            tape.release(slot(kernel, in_name, layer, tape.num_layers))
    if gathered is not None and not save:
        tape.release(shard_slot(gathered))  # no backward will gather it again


def _forward_saving(tape: Tape, kernel: TorchKernel, in_keys: list[Slot], out_keys: list[Slot],
                    inputs: list[torch.Tensor], ctx: KernelContext,
                    params: Sequence[tuple[ParamRef, torch.Tensor]],
                    gathered: Slot | None = None) -> tuple[Saved, list[torch.Tensor]]:
    """The forward with autograd on; returns its state and its output values (detached).
    `gathered`: an input slot autograd must not keep (SP), only refer to."""
    held: list[int] = []
    packed: set[int] = set()
    meter = tape.meter
    skip = tape.acts[gathered].untyped_storage().data_ptr() if gathered is not None else None

    def pack(t: torch.Tensor) -> torch.Tensor | _SlotRef:
        ptr = t.untyped_storage().data_ptr()
        if ptr == skip:
            assert gathered is not None
            return _SlotRef(tape, gathered, tuple(t.shape), t.stride(), int(t.storage_offset()))
        held.append(meter.hold(t, "activations"))
        packed.add(ptr)
        return t

    sources: list[tuple[Slot, list]] = []
    anchor = None
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
        args = []
        for key, name, value in zip(in_keys, kernel.inputs, inputs):
            if name in NON_DIFFERENTIABLE or not value.is_floating_point():
                args.append(value)
                continue
            if anchor is None:
                anchor = torch.zeros((), requires_grad=True)
            sink: list = []
            sources.append((key, sink))
            args.append(_Source.apply(anchor, value, sink))
        outs = kernel.fn(ctx, *args, *(p for _, p in params))
    values = []
    for out in outs:
        values.append(out.detach())
        if out.grad_fn is not None and out._base is None and \
                out.untyped_storage().data_ptr() not in packed:
            # The tape's slot keeps the storage; the graph node needs only the shape it recorded
            # (unless autograd saved the output itself, as softmax does).
            out.data = torch.empty(0, dtype=out.dtype, device=out.device)
    state = Saved(anchor, sources, list(zip(out_keys, outs)), list(params), held, gathered)
    return state, values


def _unpack(t: torch.Tensor | _SlotRef) -> torch.Tensor:
    return t.unpack() if isinstance(t, _SlotRef) else t


def backward(tape: Tape, name: Kernel, layer: int | None, *, defer: bool = False
             ) -> list[tuple[ParamRef, torch.Tensor]]:
    """Run kernel `name`'s backward for this micro-batch: gradients of its outputs from the
    tape in, gradients of its inputs into the tape; returns its parameters' gradients.
    `defer`: a zero-bubble B (`traces.zero_bubble`): the input gradients only, the graph kept
    (with what it saved) for `weight_backward`, which returns the parameters' gradients."""
    state = tape.saved.pop((name, layer), None)
    if state is None:
        raise RuntimeError(f"backward of {name} (layer {layer}) without its forward state")
    outs, grads = [], []
    for key, out in state.outputs:
        if out.requires_grad:
            outs.append(out)
            grads.append(tape.take_grad(key))
    if defer:
        tape.deferred[(name, layer)] = _Deferred(state, outs, grads)
        if state.anchor is not None and outs:
            Variable._execution_engine.run_backward(  # type: ignore[attr-defined]
                tuple(outs), tuple(grads), True, False, (state.anchor,), True, False)
        _put_input_grads(tape, state)
        return []
    wrt = ([state.anchor] if state.anchor is not None else []) + [p for _, p in state.params]
    result = Variable._execution_engine.run_backward(  # type: ignore[attr-defined]
        tuple(outs), tuple(grads), False, False, tuple(wrt), True, False) if outs else \
        (None,) * len(wrt)  # nothing differentiable out (MoE's aux_loss at coefficient 0)
    _drop(tape, state)
    _put_input_grads(tape, state)
    offset = 1 if state.anchor is not None else 0
    return [(ref, g) for (ref, _), g in zip(state.params, result[offset:]) if g is not None]


@dataclass(slots=True)
class _Deferred:
    """A kernel's state between a split backward's B and its W."""

    state: Saved
    outs: list[torch.Tensor]
    grads: list[torch.Tensor]


def weight_backward(tape: Tape, name: Kernel, layer: int | None
                    ) -> list[tuple[ParamRef, torch.Tensor]]:
    """A zero-bubble W: the parameters' gradients of the graph `backward(defer=True)` kept,
    which it then frees."""
    deferred = tape.deferred.pop((name, layer), None)
    if deferred is None:
        raise RuntimeError(f"weight gradients of {name} (layer {layer}) before its B")
    state, wrt = deferred.state, tuple(p for _, p in deferred.state.params)
    result = Variable._execution_engine.run_backward(  # type: ignore[attr-defined]
        tuple(deferred.outs), tuple(deferred.grads), False, False, wrt, True, False) \
        if deferred.outs and wrt else (None,) * len(wrt)
    _drop(tape, state)
    return [(ref, g) for (ref, _), g in zip(state.params, result) if g is not None]


def phase_backward(tape: Tape, name: Kernel, phase: Phase, layer: int | None, layout: Layout
                   ) -> list[tuple[ParamRef, torch.Tensor]]:
    """A kernel's backward op (phase bwd or wgrad); split (`traces.zero_bubble`): a weight
    GEMM's B computes the input gradients and keeps the graph, its W the weight gradients."""
    split = splits_backward(layout.schedule) and name in WEIGHT_GEMMS
    if phase is Phase.WGRAD and split:
        return weight_backward(tape, name, layer)
    return backward(tape, name, layer, defer=split)


def _drop(tape: Tape, state: Saved) -> None:
    """Free what a kernel's graph saved, and its gathered input (SP)."""
    for ptr in state.held:
        tape.meter.drop(ptr)
    if state.gathered is not None:
        tape.release(state.gathered)
        tape.release(shard_slot(state.gathered))


def _put_input_grads(tape: Tape, state: Saved) -> None:
    for key, sink in state.sources:
        if sink:
            tape.put_grad(key, sink[0])
