"""A hand-written step for tests: GPipe (vp = 1) in the op order of docs/plan-ops.md, driving
a `RankRuntime` the way the plan interpreter will (until the kernel-level plan lands).

Collectives and sends are issued where the doc puts them; the numerics tests then show that
the runtime's ops, in that order, compute what the single-process reference computes.
"""

from __future__ import annotations

from executor.comm import Handle
from executor.params import EMBED, HEAD, layer_unit
from executor.runtime import RankRuntime
from traces.kernel_groups import CORE_KERNELS, FIRST_STAGE, LAST_STAGE, STEP_KERNELS, layer_kernels
from traces.layout import Axis, Recompute
from traces.ops import Phase, Stream
from traces.plan.optimizer import grad_stats_group
from traces.plan.tensor import tp_sites
from traces.purpose import Kernel, Stat, StepStat
from traces.stack import regathers

CORE = CORE_KERNELS


def _kernels(rt: RankRuntime, names: tuple[Kernel, ...] | list[Kernel], phase: Phase,
             layer: int | None, mb: int) -> None:
    """Run kernels in order, with the TP collectives around them where the doc puts them."""
    tp = rt.layout.tp > 1
    sites = tp_sites(rt.layout.sp, regathers(rt.model)) if tp else {}
    for name in names:
        before, after = sites.get((name, phase is Phase.BWD), ((), ()))
        for site in before:
            rt.tp(site, layer, mb)
        rt.compute(name, phase, layer, mb)
        for site in after:
            rt.tp(site, layer, mb)
        if name == "logits" and phase is Phase.FWD and tp:
            rt.ce_collective(Stat.MAX, mb)
        if name == "cross_entropy" and phase is Phase.FWD and tp:
            rt.ce_collective(Stat.SUM, mb)


class Step:
    """One GPipe step on one rank; `handles` are the asynchronous calls still to wait on."""

    def __init__(self, rt: RankRuntime, sp_after: bool = False) -> None:
        self.rt = rt
        self.reduced_grads: list = []
        """What the optimizer read (GradStore.optimizer_grads), kept for the tests."""
        self.sp_after = sp_after
        """SP gradients summed once after the DP reduction, not per unit before it."""
        self.handles: list[Handle] = []
        lay, model = rt.layout, rt.model
        assert lay.vp == 1, "the test driver runs one stage per rank"
        self.stage = rt.pp_rank
        self.layers = list(lay.layers_of_stage(model, self.stage))
        self.first, self.last = self.stage == 0, self.stage == lay.pp - 1
        self.layer_kernels = layer_kernels(model.attention, rope=model.position == "rope",
                                           ffn=model.ffn, mla=model.mla,
                                           dropout=model.dropout > 0, qk_norm=model.qk_norm)
        self.zero3 = rt.zero == 3
        self.closing = {b.units[-1]: b.index for b in rt.buckets}

    def run(self) -> dict[int, float]:
        m = self.rt.layout.num_microbatches
        for mb in range(m):
            self.forward(mb)
        for mb in range(m):
            self.backward(mb, final=mb == m - 1)
        for h in self.handles:
            h.wait()
        self.handles.clear()
        self.finish()
        losses = dict(self.rt.losses)
        self.rt.losses.clear()
        self.rt.end_step()
        return losses

    def peer(self, stage: int) -> int:
        coords = self.rt.layout.coords(self.rt.rank)
        return self.rt.layout.rank_of(coords.moved(Axis.PP, stage))

    def gather(self, unit: str) -> None:
        if self.zero3:
            self.rt.gather_unit(unit, async_op=False)

    def forward(self, mb: int) -> None:
        rt = self.rt
        if self.first:
            self.gather(EMBED)
            _kernels(rt, FIRST_STAGE, Phase.FWD, None, mb)
        else:
            rt.pipe.recv(self.layers[0], mb, "act", self.peer(self.stage - 1)).wait()
            if rt.pipe.scatter_gather:
                rt.pipe.gather_received(self.layers[0], mb, "act")
        for layer in self.layers:
            self.gather(layer_unit(layer))
            _kernels(rt, self.layer_kernels, Phase.FWD, layer, mb)
        if self.last:
            self.gather(HEAD)
            _kernels(rt, LAST_STAGE, Phase.FWD, None, mb)
        else:
            self.handles.append(rt.pipe.send(self.layers[-1] + 1, mb, "act",
                                             self.peer(self.stage + 1)))

    def backward(self, mb: int, final: bool) -> None:
        rt = self.rt
        if self.last:
            self.gather(HEAD)
            _kernels(rt, LAST_STAGE[::-1], Phase.BWD, None, mb)
            self.reduced(HEAD, final)
        else:
            rt.pipe.recv(self.layers[-1] + 1, mb, "grad", self.peer(self.stage + 1)).wait()
            if rt.pipe.scatter_gather:
                rt.pipe.gather_received(self.layers[-1] + 1, mb, "grad")
        for layer in reversed(self.layers):
            self.gather(layer_unit(layer))
            if rt.layout.recompute is Recompute.FULL:
                _kernels(rt, self.layer_kernels, Phase.RECOMPUTE, layer, mb)
            elif rt.layout.recompute is Recompute.SELECTIVE:
                _kernels(rt, [k for k in self.layer_kernels if k in CORE], Phase.RECOMPUTE,
                         layer, mb)
            _kernels(rt, self.layer_kernels[::-1], Phase.BWD, layer, mb)
            self.reduced(layer_unit(layer), final)
        if self.first:
            self.gather(EMBED)
            _kernels(rt, FIRST_STAGE[::-1], Phase.BWD, None, mb)
            self.reduced(EMBED, final)
        else:
            self.handles.append(rt.pipe.send(self.layers[0], mb, "grad", self.peer(self.stage - 1)))

    def reduced(self, unit: str, final: bool) -> None:
        """A unit's gradients for this micro-batch are complete: reduce them if it is time
        (SP: first sum its replicated parameters' gradients over the TP group)."""
        rt = self.rt
        if not (self.zero3 or final or rt.zero == 2):
            return
        stream = Stream.ZERO_RS if self.zero3 else Stream.DP
        replicated = any(spec.sp_partial for spec in rt.flat.specs[unit])  # rope: embed has none
        if rt.layout.sp and not self.sp_after and replicated:
            handle = rt.sp_grads(unit, stream)
            assert handle is not None
            handle.wait()  # the bucket's reduction reads what it writes
        if rt.layout.dp > 1 and unit in self.closing:
            self.handles.append(rt.reduce_bucket(self.closing[unit], stream))

    def finish(self) -> None:
        rt = self.rt
        if rt.layout.pp > 1 and rt.model.tied_embeddings and (self.first or self.last):
            rt.embedding_grads().wait()
        if rt.layout.sp and self.sp_after:
            rt.sp_grads()
        self.reduced_grads = [g.clone() for g in rt.grads.optimizer_grads()]
        group = grad_stats_group(rt.layout, rt.rank)
        for kernel in STEP_KERNELS[:-1]:  # the plan's step end (traces.plan.optimizer)
            if kernel is Kernel.GRAD_UNSCALE and rt.model.dtype != "fp16":
                continue
            rt.step_kernel(kernel)
            stat = {Kernel.GRAD_UNSCALE: StepStat.FOUND_INF, Kernel.GRAD_NORM: StepStat.NORM}
            if kernel in stat and len(group) > 1:
                rt.grad_stat(stat[kernel], group).wait()
        rt.optimizer_step()
        if rt.zero in (1, 2):
            for h in [rt.gather_bucket(b.index) for b in rt.buckets]:
                h.wait()
