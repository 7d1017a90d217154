"""One rank's executable model: what each op of docs/plan-ops.md does, as a method.

`RankRuntime` holds the rank's parameters (its TP shard of its stages' units, ZeRO-3: its DP
shard), gradient buffers, AdamW state, and one `Tape` per micro-batch in flight. The plan
interpreter calls, per op's purpose (`traces.purpose`, through `executor.calls`):

    KernelRun             compute(kernel, phase, layer, mb); the step's end: step_kernel(
                          kernel) (norm, clip, fp16's check), optimizer_step()
    GradStat              grad_stat(stat, group, stream)
    TpSite                tp(site, layer, mb)
    TpChunk               tp_chunk(chunk, layer, mb, stream) -> Handle  (tp_comm_overlap;
                          executor.overlap); GemmChunk: gemm_chunk(...), the kernel at one chunk
    CrossEntropyStat      ce_collective(stat, mb)
    GradBucket            reduce_bucket(index, stream) -> Handle  (UnitGradReduce: its unit's)
    ParamGather           gather_bucket(index, stream) (ZeRO-1/2)
    UnitGather            gather_unit(unit, stream) (ZeRO-3)
    SpGrads               sp_grads(unit, stream)
    EmbeddingGrads        embedding_grads()
    PipeMessage           pipe.send(boundary, mb, tag, peer) / pipe.recv(...) -> Handle
    MessageGather         pipe.gather_received(boundary, mb, tag)  (no SP: the TP chunks of a
                          pipeline message; executor.pipe)
    CpRing, CpGather      cp_message(...) -> Handle, cp_exchange(...); the attention core under
                          CP: cp_attend(phase, layer, mb, step) (executor.context)
    ExpertAllToAll        expert_all_to_all(step, grad, layer, mb) (executor.moe)
    ExpertGrads           expert_grads(layer, stream) -> Handle (executor.experts)
    ExpertParamGather     gather_experts(layer, stream) -> Handle (ZeRO-1/2 over expert-DP;
                          ExpertUnitGather: ZeRO-3's per use, executor.expert_fsdp)

Under context parallelism a micro-batch's tape holds the rank's s/cp tokens (chunks cp_rank
and 2·cp − 1 − cp_rank), gradients are reduced and ZeRO shards over DP x CP.

Everything is deterministic given the seed: the same parameters on every rank as in the
single-process reference (`executor.reference`), and the same data.
"""

from __future__ import annotations

import dataclasses

import torch

from executor import tape as tapes
from executor.clip import GradClip
from executor.comm import Comm, Handle
from executor.context import CpRank, local_tokens
from executor.expert_fsdp import expert_store
from executor.experts import ExpertStore
from executor.flat import Bucket, FlatLayout, rule_buckets, unit_buckets
from executor.grads import GradStore
from executor.groups import GroupKey
from executor.kernels import KernelContext, ce_loss, mla_fields, slot, table_of
from executor.memory import MemoryMeter
from executor.moe import MoeExchange, moe_kernels
from executor.optim import AdamW, ParamStore
from executor.options import RunOptions, check_supported
from executor.overlap import ChunkedTp, run_at
from executor.params import DTYPES, EMBED, HEAD, holds_output_weights, layer_unit
from executor.pipe import PipeMessages
from executor.reference import microbatch
from executor.tape import ParamRef, Tape
from traces.fsdp import frees_after
from traces.layout import Axis, Layout
from traces.model import ModelSpec
from traces.ops import OpKind, Phase, Stream
from traces.plan.context import stack_repeats_kv
from traces.plan.optimizer import grad_stats_group
from traces.purpose import GemmPart, Kernel, MoeStep, Stat, StepStat, TpChunk, TpSite, Unit
from traces.stack import regathers

# ZeRO-3 frees a unit's gathered parameters after its last kernel of a pass (as frees_after says).
_LAST_OF_PASS = {(Phase.FWD, Kernel.BDA2), (Phase.FWD, Kernel.POS_EMBED),
                 (Phase.FWD, Kernel.CROSS_ENTROPY), (Phase.BWD, Kernel.LN1),
                 (Phase.BWD, Kernel.EMBED), (Phase.BWD, Kernel.FINAL_LN)}


class RankRuntime:
    def __init__(self, model: ModelSpec, layout: Layout, rank: int, comm: Comm,
                 options: RunOptions, device: torch.device, *,
                 buckets: list[Bucket] | None = None, meter: MemoryMeter | None = None) -> None:
        check_supported(model, layout, options)
        self.model, self.layout, self.rank, self.comm = model, layout, rank, comm
        self.options, self.device = options, device
        self.meter = meter or MemoryMeter()
        c = layout.coords(rank)
        self.tp_rank, self.dp_rank, self.pp_rank = c.tp, c.dp, c.pp
        self.zero = layout.zero if layout.data_degree > 1 else 0
        self.dp_group = layout.data_group(rank)  # DP x CP: what gradients are reduced over
        shard = self.dp_group.index(rank)
        self.dtype = DTYPES[model.dtype]
        self.flat = FlatLayout(model, layout, self.pp_rank)
        self.grad_bytes = 4 if layout.fp32_main_grads else model.dtype_bytes
        if buckets is None:
            buckets = unit_buckets(self.flat) if self.zero == 3 else \
                rule_buckets(self.flat)
        self.buckets = buckets
        self.params = ParamStore(self.flat, buckets, zero=self.zero, dp=layout.data_degree,
                                 dp_rank=shard, tp_rank=self.tp_rank, seed=options.seed,
                                 device=device, meter=self.meter)
        # Megatron-LM's --accumulate-allreduce-grads-in-fp32: gradients in fp32.
        grad_dtype = torch.float32 if layout.fp32_main_grads else self.dtype
        self.grads = GradStore(self.flat, buckets, zero=self.zero, dp=layout.data_degree,
                               dp_rank=shard, dtype=grad_dtype, device=device,
                               meter=self.meter)
        self.optimizer = AdamW(self.params.optimizer_params(), options.adamw, self.meter)
        # ZeRO 0 with a statistics group over DP replicas (EP > 1): each counts once
        stats = set(grad_stats_group(layout, rank))
        dense = self.zero != 0 or shard == 0 or len(stats & set(self.dp_group)) == 1
        self.clip = GradClip(self.flat, buckets, self.grads.shards, tp_rank=self.tp_rank,
                             tied=model.tied_embeddings, max_norm=options.clip_grad,
                             device=device, counted=dense)
        self.grad_norm = 0.0
        """The global gradient norm of the last step (before clipping)."""
        self.tp_key: GroupKey = (Stream.COMPUTE, layout.group(rank, Axis.TP))
        self.embedding_key: GroupKey = (Stream.DP, layout.embedding_group(rank))
        self.chunked = ChunkedTp(comm, layout.tp, model.layers, regathers(model))
        self.stale: set[int] = set()
        """overlap_param_gather: buckets whose parameters the last step updated and no gather
        has brought in yet (the next step's forward would)."""
        self.tapes: dict[int, Tape] = {}
        self.losses: dict[int, float] = {}
        self.step = 0
        self.tokens_per_mb = model.seq_len * layout.micro_batch
        self.loss_scale = 1.0 / (self.tokens_per_mb * layout.num_microbatches * layout.dp)
        self.kernels = table_of(model)
        self.experts: ExpertStore | None = None
        self.moe: MoeExchange | None = None
        if model.experts:  # MoE layers: their kernels, experts and all-to-alls
            self.kernels = {**self.kernels, **moe_kernels(model, layout, rank)}
            self.experts = expert_store(model, layout, rank, seed=options.seed,
                                        grad_dtype=grad_dtype, device=device,
                                        meter=self.meter, adamw=options.adamw)
            self.moe = MoeExchange(model, layout, rank, comm, options.gpus_per_node)
        self._ctx = KernelContext(heads=model.heads // layout.tp, **mla_fields(model),
                                  tp=layout.tp,
                                  kv_heads=model.kv_heads // layout.tp,
                                  rmsnorm=model.norm == "rmsnorm",
                                  tp_rank=self.tp_rank, sp=layout.sp,
                                  vocab_shard=model.vocab // layout.tp, dropout=options.dropout,
                                  seed=options.seed, cp=layout.cp, cp_rank=c.cp)
        self.cp: CpRank | None = None
        if layout.cp > 1:  # one K/V block: [2, b, kv heads / t, s / cp, d]; torch's stacks
            groups = model.kv_heads // layout.tp  # send K/V at the query heads
            repeat = stack_repeats_kv(model)
            block = (2, layout.micro_batch, model.heads // layout.tp if repeat else groups,
                     model.seq_len // layout.cp, model.head_dim)
            self.cp = CpRank(layout, rank, comm, self.tapes, block_shape=block,
                             seq_len=model.seq_len, dtype=self.dtype, device=device,
                             groups=groups, repeat=repeat)
        self.pipe = PipeMessages(model, layout, comm, self.tape, tp_rank=self.tp_rank,
                                 tp_key=self.tp_key, dtype=self.dtype, device=device)

    # --- per step and micro-batch ------------------------------------------------------------

    def tape(self, mb: int) -> Tape:
        t = self.tapes.get(mb)
        if t is None:
            t = self.tapes[mb] = Tape(self.meter, self.model.layers, self.kernels)
            tokens, targets = microbatch(self.model, self.layout, self.options.seed, self.step,
                                         self.dp_rank, mb)
            if self.layout.cp > 1:
                cp, rank = self.layout.cp, self._ctx.cp_rank
                tokens, targets = local_tokens(tokens, cp, rank), local_tokens(targets, cp, rank)
            t.put(("D", "tokens"), tokens.to(self.device))
            t.put(("D", "targets"), targets.to(self.device))
        return t

    def end_step(self) -> None:
        """Forget the step's tapes (each should be empty by now) and count the step."""
        for t in self.tapes.values():
            t.clear()
        self.tapes.clear()
        for unit in self.flat.units:
            self.params.free_unit(unit)
        if self.experts is not None:
            self.experts.free_all()
        self.step += 1

    def _kernel_context(self, layer: int | None, mb: int) -> KernelContext:
        return dataclasses.replace(self._ctx, layer=-1 if layer is None else layer,
                                   microbatch=mb, step=self.step)

    def _unit(self, name: Kernel, layer: int | None) -> Unit:
        scope = self.kernels[name].scope
        if scope == "layer":
            assert layer is not None, f"{name} needs a layer"
            return layer_unit(layer)
        return EMBED if scope == "E" else HEAD

    def _params(self, name: Kernel, layer: int | None) -> list[tuple[ParamRef, torch.Tensor]]:
        unit = self._unit(name, layer)
        refs = []
        for pname in self.kernels[name].params:
            ref = (unit, pname)
            if pname == "output" and not holds_output_weights(self.model, self.layout,
                                                              self.pp_rank):
                ref = (EMBED, "word")  # tied: the logits use the embedding tensor itself
            store = self.experts if pname.startswith("experts.") else self.params
            assert store is not None
            refs.append((ref, store.leaf(*ref)))
        return refs

    # --- compute ops -------------------------------------------------------------------------

    def compute(self, name: Kernel, phase: Phase, layer: int | None, mb: int, part: int = 0
                ) -> None:
        """Kernel `name`; `part` > 0: a later op of a grouped GEMM (`executor.moe`), which
        the first ran whole."""
        if part:
            return
        tape = self.tape(mb)
        recompute = self.layout.recompute
        if phase in (Phase.BWD, Phase.WGRAD):
            for ref, grad in tapes.phase_backward(tape, name, phase, layer, self.layout):
                store = self.experts if ref[1].startswith("experts.") else self.grads
                assert store is not None
                store.accumulate(*ref, grad)
        else:
            save = phase is Phase.RECOMPUTE or not tapes.recomputed(name, recompute)
            tapes.forward(tape, name, layer, self._kernel_context(layer, mb),
                            self._params(name, layer),
                            save=save, recompute=recompute,
                            recomputing=phase is Phase.RECOMPUTE)
            if name is Kernel.CROSS_ENTROPY and self.layout.tp == 1:
                self._finish_loss(mb)
        if self.zero == 3 and (phase, name) in _LAST_OF_PASS and \
                frees_after(self.layout, phase is Phase.FWD, mb):
            self._free_after(name, layer, phase)

    def _free_after(self, name: Kernel, layer: int | None, phase: Phase) -> None:
        unit = self._unit(name, layer)
        if self.experts is not None and unit.layer is not None:
            self.experts.release(unit.layer)  # FSDP with EP: the layer's experts too
        tied_here = not holds_output_weights(self.model, self.layout, self.pp_rank)
        if unit == EMBED and tied_here:
            return  # the logits use the word embeddings too: kept until the step ends
        self.params.release_unit(unit)

    def _finish_loss(self, mb: int) -> None:
        """Loss from the TP-summed statistics, and the gradient of the statistics."""
        tape = self.tapes[mb]
        stats = tape.acts[("H", "stats")]
        loss = ce_loss(stats)
        self.losses[mb] = float(loss.mean())
        grad = torch.empty_like(stats)
        grad[0] = -self.loss_scale            # d loss / d target logit
        grad[1] = self.loss_scale / stats[1]  # d log(sum exp) / d sum exp
        tape.put_grad(("H", "stats"), grad)
        tape.release(("H", "stats"))

    # --- tensor parallelism ------------------------------------------------------------------

    def tp(self, site: TpSite, layer: int | None, mb: int) -> None:
        """The collective at one of Megatron's f/g sites (`traces.plan.tensor.tp_sites`)."""
        tape = self.tape(mb)
        key = slot(self.kernels[site.kernel], site.slot, layer, self.model.layers)
        if site.saved:  # backward: the shard the forward kept, gathered again
            value = tape.acts[tapes.shard_slot(key)]
        elif site.kind is OpKind.ALL_GATHER and not site.grad:
            # forward: Megatron's GEMM keeps its input's shard for backward; DTensor's keeps
            # the gathered input, which autograd saves (`traces.stack.regathers`)
            value = tape.take(key).contiguous()
            if self.chunked.keep_shard:
                tape.put(tapes.shard_slot(key), value)
        else:
            value = (tape.grads if site.grad else tape.acts)[key].contiguous()
        t = self.layout.tp
        if site.kind is OpKind.ALL_REDUCE:
            self.comm.all_reduce(value, self.tp_key)
            out = value
        elif site.kind is OpKind.REDUCE_SCATTER:
            out = value.new_empty((value.shape[0] // t, *value.shape[1:]))
            self.comm.reduce_scatter(out, value, self.tp_key)
        else:
            out = value.new_empty((value.shape[0] * t, *value.shape[1:]))
            self.comm.all_gather(out, value, self.tp_key)
        if site.grad:
            tape.replace_grad(key, out)
        else:
            tape.put(key, out)

    def gemm_chunk(self, name: Kernel, phase: Phase, part: GemmPart, index: int, count: int,
                   layer: int | None, mb: int) -> None:
        """A chunk of an overlapped GEMM: the whole kernel at the chunk `run_at` names."""
        if run_at(name, part, index, count):
            self.compute(name, phase, layer, mb)

    def tp_chunk(self, chunk: TpChunk, layer: int | None, mb: int, stream: str) -> Handle:
        """A chunk of a TP collective, asynchronous on `stream` (`executor.overlap`)."""
        return self.chunked.issue(self.tape(mb), mb, chunk, layer, (stream, self.tp_key[1]))

    def ce_collective(self, stat: Stat, mb: int) -> None:
        """max: the max over the TP group of the logits' row maxima; sum: the sum of the
        cross-entropy statistics (then the loss)."""
        tape = self.tape(mb)
        if stat is Stat.MAX:
            self.comm.all_reduce(tape.acts[("H", "lmax")], self.tp_key, reduce="max")
            return
        assert stat is Stat.SUM, stat
        self.comm.all_reduce(tape.acts[("H", "stats")], self.tp_key)
        self._finish_loss(mb)

    # --- expert parallelism (executor.moe, executor.experts) -------------------------------

    def expert_all_to_all(self, step: MoeStep, grad: bool, layer: int, mb: int,
                          stream: str = Stream.COMPUTE) -> Handle | None:
        assert self.moe is not None, "EP ops in a plan without experts"
        handle = self.moe.all_to_all(self.tape(mb), step, grad, layer, stream)
        return None if stream == Stream.COMPUTE else handle

    def routing_gather(self, layer: int) -> None:
        assert self.moe is not None, "EP ops in a plan without experts"
        self.moe.gather_routing(layer)

    def expert_grads(self, layer: int, stream: str = Stream.DP, *, async_op: bool = True
                     ) -> Handle:
        assert self.experts is not None, "expert gradients in a plan without experts"
        return self.experts.reduce(layer, self.comm, stream, async_op=async_op)

    def gather_experts(self, layer: int, stream: str = Stream.DP, *, async_op: bool = True
                       ) -> Handle:
        assert self.experts is not None, "expert parameters in a plan without experts"
        return self.experts.gather(layer, self.comm, stream, async_op=async_op)

    # --- context parallelism (executor.context) ------------------------------------------------

    def cp_attend(self, phase: Phase, layer: int, mb: int, step: int) -> None:
        assert self.cp is not None, "CP ops in a plan without cp"
        self.cp.attend(self.tape(mb), phase, layer, mb, step, self._kernel_context(layer, mb))

    def cp_message(self, phase: Phase, send: bool, step: int, backward: bool, layer: int,
                   mb: int, peer: int, tag: str) -> Handle:
        assert self.cp is not None, "CP ops in a plan without cp"
        return self.cp.message(self.tape(mb), phase, send, step, backward, layer, mb, peer, tag,
                               self._kernel_context(layer, mb))

    def cp_exchange(self, grad: bool, phase: Phase, layer: int, mb: int) -> None:
        assert self.cp is not None, "CP ops in a plan without cp"
        self.cp.exchange(self.tape(mb), grad, phase, layer, mb, self._kernel_context(layer, mb))

    # --- data parallelism and ZeRO -------------------------------------------------------------

    def reduce_bucket(self, index: int, stream: str = Stream.DP, *,
                      async_op: bool = True) -> Handle:
        return self.grads.reduce(index, self.comm, (stream, self.dp_group), async_op=async_op)

    def gather_bucket(self, index: int, stream: str = Stream.DP, *,
                      async_op: bool = True) -> Handle:
        self.stale.discard(index)
        return self.params.gather_bucket(index, self.comm, (stream, self.dp_group),
                                         async_op=async_op)

    def gather_unit(self, unit: Unit, stream: str = Stream.ZERO_AG, *,
                    async_op: bool = True) -> Handle:
        return self.params.gather_unit(unit, self.comm, (stream, self.dp_group),
                                       async_op=async_op)

    def sp_grads(self, unit: Unit | None = None, stream: str = Stream.DP, *,
                 async_op: bool = True) -> Handle | None:
        """With SP, sum the replicated parameters' partial gradients over the TP group: one
        unit's, before its DP reduction (on the reduction's stream), or, with no unit, the
        whole rank's once after the DP reduction (docs/plan-ops.md's first wording)."""
        if unit is None:
            self.grads.sp_all_reduce(self.comm, self.tp_key)
            return None
        key = (stream, self.tp_key[1])
        return self.grads.sp_unit_all_reduce(unit, self.comm, key, async_op=async_op)

    def embedding_grads(self, stream: str = Stream.DP, *, async_op: bool = True) -> Handle:
        """Tied embeddings across stages: sum the word-embedding gradients of the first stage
        (embed.word) and the last (head.output) so both copies take the same step."""
        ref = (EMBED, "word") if EMBED in self.flat.units else (HEAD, "output")
        assert self.zero == 0 and self.grads.full is not None, "check_supported"
        a, b = self.flat.param_range[ref]
        key = (stream, self.embedding_key[1])
        return self.comm.all_reduce(self.grads.full[a:b], key, async_op=async_op)

    def step_kernel(self, kernel: Kernel) -> None:
        """One kernel of the step's end before the optimizer (`executor.clip`)."""
        grads = self.grads.optimizer_grads()
        experts = self.experts.grad_segments() if self.experts is not None else []
        if kernel is Kernel.GRAD_UNSCALE:
            self.clip.check_inf(grads + experts)  # the loss is unscaled: only the check
        elif kernel is Kernel.GRAD_NORM:
            self.clip.square_sum(grads)
            if self.experts is not None:
                self.clip.norm_sq += self.experts.square_sum()
        else:
            assert kernel is Kernel.GRAD_CLIP, kernel
            self.grad_norm = self.clip.clip(grads + experts)

    def grad_stat(self, stat: StepStat, group: tuple[int, ...], stream: str = Stream.COMPUTE
                  ) -> Handle:
        """All-reduce a step statistic over the ranks holding distinct gradients: the found-
        inf flag (max) or the squares' sum (sum)."""
        if stat is StepStat.FOUND_INF:
            return self.comm.all_reduce(self.clip.found_inf, (stream, group), reduce="max")
        return self.comm.all_reduce(self.clip.norm_sq, (stream, group))

    def optimizer_step(self) -> None:
        if not self.clip.skip:  # fp16: a non-finite gradient somewhere skips the step
            self.optimizer.step(self.grads.optimizer_grads())
            if self.experts is not None:
                self.experts.step()
        self.clip.found_inf.zero_()
        self.grads.zero_()
        if self.experts is not None:
            self.experts.zero_()
        if self.layout.overlap_param_gather and self.zero in (1, 2):
            self.stale = set(range(len(self.buckets)))

    # --- inspection ----------------------------------------------------------------------------

    def unit_params(self, unit: Unit) -> dict[str, torch.Tensor]:
        """A unit's current parameters on this rank (ZeRO-3: gathers it; collective)."""
        experts = self.experts.tensors(unit, self.comm) if self.experts is not None else {}
        if self.zero == 3:
            self.gather_unit(unit, async_op=False)
            out = self.params.unit_tensors(unit)
            self.params.release_unit(unit)
            return {**out, **experts}
        for index in sorted(self.stale):  # as Megatron-Core's forced param sync before a save
            self.gather_bucket(index, async_op=False)
        return {**self.params.unit_tensors(unit), **experts}
