"""A rank's plan lowered to runtime calls: what each op does, decided once, before any step.

`lower(plan, model, layout, rank)` maps every op to a `Call` — a `RankRuntime` method and its
arguments — or raises ConfigError naming the op it cannot run, so a bad plan fails before
anything starts. Nothing here touches tensors; `executor.interpreter` binds the calls to a
runtime and runs them. What the plan leaves implicit is read from the ops around an op:

    tp              the compute ops before and after it (executor.sites); an all-gather
                    that depends on a receive gathers that receive's TP chunks (pipeline
                    messages without SP, Megatron-LM's scatter-gather)
    sp_grads        its unit, from the name (`sp_grads` + layer, `sp_grads.embed`, ...)
    grads, params   ZeRO-3: the unit in the name (`grads` + layer, `grads.embed`, ...);
                    ZeRO 0-2: the k-th bucket of its round (the step for ZeRO 0/1 and for the
                    all-gathers after the optimizer, the micro-batch for ZeRO 2), sized by the
                    plan's own `grads` ops, which must cut the flat order at unit boundaries
    send / recv     the stage boundary from its `layer` (the layer whose input or output it
                    carries): an activation received, or a gradient sent back, is layer l's
                    input; an activation sent on, or a gradient received, its output
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from executor.flat import Bucket, FlatLayout, sized_buckets, unit_buckets
from executor.kernels import KERNELS
from executor.params import EMBED, HEAD, layer_unit
from executor.sites import tp_site
from traces.chrome import event_name
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Op, OpKind, Phase, Trace


@dataclass(frozen=True, slots=True)
class Call:
    """RankRuntime.<method>(*args); `asynchronous`: returns a Handle to wait on."""

    method: str
    args: tuple
    asynchronous: bool = False


@dataclass(frozen=True, slots=True)
class RankProgram:
    calls: tuple[Call, ...]
    buckets: list[Bucket]


def lower(plan: Trace, model: ModelSpec, layout: Layout, rank: int) -> RankProgram:
    return _Lowering(plan.ops[rank], model, layout, rank).run()


class _Lowering:
    def __init__(self, ops: tuple[Op, ...], model: ModelSpec, layout: Layout, rank: int) -> None:
        self.ops, self.model, self.layout, self.rank = ops, model, layout, rank
        self.zero = layout.zero if layout.dp > 1 else 0
        self.flat = FlatLayout(model, layout, layout.coords(rank).pp)
        self.buckets = self._buckets()

    def fail(self, index: int, rule: str) -> ConfigError:
        op = self.ops[index]
        return ConfigError(f"plan: rank {self.rank} op {index} ({event_name(op)}): {rule}")

    def run(self) -> RankProgram:
        rounds: Counter = Counter()
        calls = [self._call(i, op, rounds) for i, op in enumerate(self.ops)]
        return RankProgram(tuple(calls), self.buckets)

    # --- buckets ---------------------------------------------------------------------------

    def _buckets(self) -> list[Bucket]:
        if self.zero == 3:
            return unit_buckets(self.flat)
        grads = [op for op in self.ops if op.name == "grads"]
        if not grads:  # dp = 1: one bucket per unit (nothing reduces them)
            return unit_buckets(self.flat)
        first = grads[0].microbatch if self.zero == 2 else None
        sizes = [op.size_bytes for op in grads if self.zero != 2 or op.microbatch == first]
        return sized_buckets(self.flat, sizes, self._grad_bytes())

    def _grad_bytes(self) -> int:
        return 4 if self.layout.fp32_main_grads else self.model.dtype_bytes

    def _bucket(self, index: int, rounds: Counter, key: tuple) -> int:
        k = rounds[key]
        rounds[key] += 1
        if k >= len(self.buckets):
            raise self.fail(index, f"more buckets in this round than the {len(self.buckets)} "
                                   "the plan's first round defines")
        return k

    # --- one op ----------------------------------------------------------------------------

    def _call(self, i: int, op: Op, rounds: Counter) -> Call:
        if op.kind is OpKind.COMPUTE:
            if op.name == "optimizer":
                return Call("optimizer_step", ())
            if op.name not in KERNELS:
                raise self.fail(i, f"no kernel named {op.name!r} (docs/plan-ops.md)")
            if op.phase not in (Phase.FWD, Phase.BWD, Phase.RECOMPUTE):
                raise self.fail(i, f"phase {op.phase} for a kernel")
            return Call("compute", (op.name, op.phase, op.layer, op.microbatch))
        if op.kind.is_p2p:
            return self._p2p(i, op)
        if not op.kind.is_collective:
            raise self.fail(i, f"cannot run a {op.kind} op")
        name, mb, stream = op.name, op.microbatch, op.stream
        if name == "tp" and op.kind is OpKind.ALL_GATHER and self._received(op) is not None:
            return self._gather_received(i, op)
        if name == "tp":
            prev, following = self._neighbours(i)
            assert op.phase is not None
            if tp_site(op.phase, prev, following, self.layout.sp) is None:
                raise self.fail(i, f"a tp collective between {prev} and {following} is not a "
                                   "tensor-parallel site")
            return Call("tp", (op.phase, prev, following, op.layer, mb))
        if name in ("ce_max", "ce_sum"):
            return Call("ce_collective", (name, mb))
        if name == "sp_grads" or name.startswith("sp_grads."):
            return Call("sp_grads", (self._named_unit(i, op), stream), True)
        if name == "embedding_grads":
            return Call("embedding_grads", (), True)
        if name.startswith("grads"):
            if self.zero == 3:
                return Call("reduce_bucket", (self._unit_bucket(i, op), stream), True)
            key = ("grads", mb if self.zero == 2 else None)
            return Call("reduce_bucket", (self._bucket(i, rounds, key), stream), True)
        if name.startswith("params"):
            if self.zero == 3:
                return Call("gather_unit", (self._named_unit(i, op), stream), True)
            return Call("gather_bucket", (self._bucket(i, rounds, ("params",)), stream), True)
        raise self.fail(i, f"no collective named {name!r} (docs/plan-ops.md)")

    def _neighbours(self, i: int) -> tuple[str | None, str | None]:
        """Names of the compute ops just before and after op i (the tp site's kernels)."""
        prev = next((self.ops[j].name for j in range(i - 1, -1, -1)
                     if self.ops[j].kind is OpKind.COMPUTE), None)
        following = next((self.ops[j].name for j in range(i + 1, len(self.ops))
                          if self.ops[j].kind is OpKind.COMPUTE), None)
        return prev, following

    def _named_unit(self, i: int, op: Op) -> str:
        suffix = op.name.partition(".")[2]
        if suffix in (EMBED, HEAD):
            return suffix
        if suffix or op.layer is None:
            raise self.fail(i, "a unit is a layer (with `layer` set), embed or head")
        return layer_unit(op.layer)

    def _unit_bucket(self, i: int, op: Op) -> int:
        unit = self._named_unit(i, op)
        return next(b.index for b in self.buckets if b.units == (unit,))

    def _p2p(self, i: int, op: Op) -> Call:
        if op.tag not in ("act", "grad") or op.peer is None or op.layer is None:
            raise self.fail(i, "a send/recv needs tag act or grad, a peer and the layer whose "
                               "input or output it carries")
        method = "recv" if op.kind is OpKind.RECV else "send"
        return Call(method, (_boundary(op), op.microbatch, op.tag, op.peer), True)

    def _received(self, op: Op) -> Op | None:
        """The receive an op depends on, if any."""
        return next((self.ops[d] for d in op.deps if self.ops[d].kind is OpKind.RECV), None)

    def _gather_received(self, i: int, op: Op) -> Call:
        recv = self._received(op)
        assert recv is not None
        if self.layout.sp or self.layout.tp == 1 or recv.layer is None:
            raise self.fail(i, "only a pipeline message received without SP under TP is "
                               "all-gathered after its receive")
        return Call("gather_received", (_boundary(recv), recv.microbatch, recv.tag))


def _boundary(op: Op) -> int:
    """The stage boundary a send or receive carries: the index of the layer whose input it is
    (slot (l, "x"); the gradient of an output is the gradient of the next layer's input)."""
    assert op.layer is not None
    into = (op.kind is OpKind.RECV) == (op.tag == "act")
    return op.layer if into else op.layer + 1
