"""Pass 2: tensor- and sequence-parallel collectives, on the compute stream.

Megatron-LM issues these inline, so they sit on the compute stream and the next kernel waits
for them. Its f and g operators, per kernel (docs/plan-ops.md), stated once, as the sites
(`traces.purpose.TpSite`: the kernel whose slot it is, the slot, value or gradient) that
`tp_sites` lists and the executor interprets:

    without SP   forward: all-reduce the partial sums after proj, fc2 and embed
                 backward: all-reduce the input gradient after qkv, fc1 and logits
    Latent attention (`traces.mla`) without SP keeps qkv's sites on its first GEMM, mla_down:
    the down-projection is replicated and runs on the whole ln1 output, and each rank
    back-propagates its heads' share through it, so ln1's output gradient is partial, summed
    where qkv's is; the replicated weights' partial gradients are summed over TP
    (`traces.plan.nodes.RankContext.tp_partial_params`). With SP, as Megatron-Core runs it, the
    down-projection and latent norms run on the rank's sequence shard and the up-projections
    gather the latents instead of h (`mla_sp_sites`: b·s·(q_r + k_r + r), label "tp_latent").
    with SP      forward: all-gather the sequence before qkv, fc1 and logits;
                          reduce-scatter after proj, fc2 and embed
                 backward: all-gather the gradient before proj, fc2 and (after pos_embed) embed;
                           all-gather the input again before qkv, fc1 and logits;
                           reduce-scatter after qkv, fc1 and logits

With SP the column-parallel GEMMs (qkv, fc1, logits) keep only the sequence shard of their
input for backward, as Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication does with
sequence_parallel (megatron/core/tensor_parallel/layers.py): its backward all-gathers the
saved shard over the TP group again, for the weight gradient, and then reduce-scatters the input
gradient. So SP saves a 1/t shard instead of the full b·s·h input of each of these GEMMs, and
its backward moves one b·s·h all-gather more per GEMM than TP alone. torch's DTensor
(`kernels = "eager" | "compiled"`, torchtitan) keeps the gathered input instead: no gather
again in backward, only the reduce-scatter (`traces.stack.regathers`; `regather = False`).

Each buffer is the b·s·h activation (nccl-tests' convention: the all-gather's output, the
reduce-scatter's input). With tp_comm_overlap, the sites of qkv, proj, fc1 and fc2 are
overlapped with their GEMMs instead (`traces.plan.overlap`). The vocab-parallel
cross-entropy adds two small all-reduces forward: the max of each token's logits after
`logits` (b·s fp32, `ce_max`) and the target logit and sum of exponentials after
`cross_entropy` (2·b·s fp32, `ce_sum`).

Quantized gathers. With an FP8 or FP4 model at SP, the recipes whose `Fp8Recipe.sp_gather` is
set (delayed, tensorwise, MXFP8, NVFP4) have their SP all-gathers carry the quantized tensor,
q_a bytes an element (`traces.fp8_recipes.Fp8Recipe.q_act`: 1 for the per-tensor recipes, whose
one fp32 scale is left out; MXFP8 1 + 1/32, its E8M0 scale byte per 32; NVFP4 1/2 + 1/16, an
E2M1 nibble and its E4M3 scale byte per 16): Transformer Engine's Linear quantizes a
column-parallel input's sequence shard and then calls gather_along_first_dim(...,
quantizer=input_quantizer) (module/linear.py; module/layernorm_linear.py quantizes ln_out for
every recipe before that call or fill_userbuffers_buffer_for_all_gather;
ops/fused/userbuffers_forward_linear.py likewise), and a row-parallel output gradient likewise,
hence the tensorwise amax all-reduce (`traces.plan.fp8`). The kept shard is gathered again in
backward for the weight gradient: the rowwise FP8 copy for the per-tensor recipes (TE
transposes it after the gather: Float8Quantizer supports_only_rowwise_all_gather), the
columnwise copy for MXFP8 and NVFP4 (layernorm_linear.py: "For MXFP8, columnwise only data can
be allgathered"), one copy either way. TE's distributed.py gathers an MXFP8 tensor's data and
scale_inv (`_all_gather_mxfp8`) and an NVFP4 tensor's packed data and scale_inv
(`_all_gather_nvfp4`; NVFP4's per-tensor fp32 amax is all-reduced before the cast,
`traces.plan.fp8`, so no rank's scale differs). torchao's
Float8ColwiseParallel._prepare_input_fn casts to float8 before redistribute, gated by
_float8_linear_supports_float8_allgather (dynamic, i.e. tensorwise, scaling;
float8/float8_tensor_parallel.py). torchtitan gathers rowwise inputs in bf16; TE gathers
Float8BlockQuantizer inputs in high precision (force_hp_input_gather). The recipe is the one
the model runs (`traces.fp8.recipe`: delayed where an fp8 model names none).

DTensor's shard copies. torchtitan's activations are [b, s, h] and its sequence parallelism
shards dim 1 (SequenceParallel's sequence_dim = 1, Shard(1) in apply_tp's plans), so DTensor's
redistributions call the functional collectives with gather_dim = 1 (Shard._to_replicate_tensor)
and scatter_dim = 1 (Partial._reduce_shard_value -> Shard._reduce_shard_tensor;
torch/distributed/tensor/placement_types.py). NCCL gathers and scatters along dim 0, so
funcol.all_gather_tensor follows the gather with `torch.cat(torch.chunk(res, group_size,
dim=0), dim=gather_dim)` and funcol.reduce_scatter_tensor precedes the scatter with
`torch.cat(torch.chunk(self, group_size, dim=scatter_dim))` (pytorch/pytorch
torch/distributed/_functional_collectives.py @fff02e67): one copy kernel that reads and
writes the gathered output, or the scattered input: 2x the collective's buffer (its FP8 bytes
where the gather carries FP8: torchao's Float8Tensor implements aten.cat on its data). Under
torch.compile these split + cat nodes stay in the graph, next to GEMMs Inductor does not
fuse them into; its micro_pipeline_tp pass matches them as part of the all-gather and
reduce-scatter patterns it replaces (NonZeroDimAllGather, NonZeroDimReduceScatter:
torch/_inductor/fx_passes/micro_pipeline_tp.py @00122fb), so AsyncTP's overlapped regions
have none, and every inline SP collective of a DTensor stack has one (`Kernel.TP_SHARD_COPY`,
on the compute stream). qkv's and fc1's backward reduce-scatter sums the separate wq/wk/wv
(w1/w3) input gradients first (`traces.stack.gemm_splits`, `input_grad_sum`): under
torch.compile the adds fuse into the copy, which then reads p gradients (p + 1 buffers in
all); in eager PyTorch autograd's p - 1 adds (3 buffers each) run before it, their bytes
costed on the copy (their launches on the norm's backward, `traces.stack`). Megatron-Core and
Transformer Engine keep activations [s, b, h]: their collectives run on dim 0, no copy.
"""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from typing import Any

from traces.fp8 import recipe as fp8_recipe
from traces.layout import Axis
from traces.mla import down_width
from traces.ops import Op, OpKind, OpRow, Phase, Stream, op_row, stamp_phase
from traces.plan.fp8 import TP_AMAX_GEMMS
from traces.plan.nodes import Node, Program, RankContext
from traces.plan.overlap import OVERLAPPED, Template, overlap_region, overlap_template
from traces.purpose import CrossEntropyStat, Kernel, KernelRun, Purpose, Stat, TpSite
from traces.stack import input_grad_sum, regathers
from traces.zero_bubble import WEIGHT_ONLY

K = Kernel
_AR, _AG, _RS = OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER
FP32 = 4

Sites = dict[tuple[Kernel, bool], tuple[tuple[TpSite, ...], tuple[TpSite, ...]]]
"""(kernel, phase is backward) -> the TP sites just before and just after it."""


def tp_sites(sp: bool, regather: bool = True) -> Sites:
    """Megatron-LM's f/g sites around each kernel, without or with SP (module docstring);
    `regather` False: DTensor's, no all-gather of the kept shard in backward."""
    if not sp:
        return {
            (K.PROJ, False): ((), (TpSite(K.PROJ, "attn", False, _AR),)),
            (K.FC2, False): ((), (TpSite(K.FC2, "mlp", False, _AR),)),
            (K.EMBED, False): ((), (TpSite(K.EMBED, "emb", False, _AR),)),
            (K.QKV, True): ((), (TpSite(K.QKV, "a1", True, _AR),)),
            (K.MLA_DOWN, True): ((), (TpSite(K.MLA_DOWN, "a1", True, _AR),)),
            (K.FC1, True): ((), (TpSite(K.FC1, "a2", True, _AR),)),
            (K.LOGITS, True): ((), (TpSite(K.LOGITS, "fln", True, _AR),)),
        }
    sites: Sites = {
        (K.PROJ, False): ((), (TpSite(K.PROJ, "attn", False, _RS),)),
        (K.FC2, False): ((), (TpSite(K.FC2, "mlp", False, _RS),)),
        (K.EMBED, False): ((), (TpSite(K.EMBED, "emb", False, _RS),)),
        (K.PROJ, True): ((TpSite(K.PROJ, "attn", True, _AG),), ()),
        (K.FC2, True): ((TpSite(K.FC2, "mlp", True, _AG),), ()),
        # the gradient of pos_embed's input, all-gathered before the lookup's backward
        (K.EMBED, True): ((TpSite(K.POS_EMBED, "emb", True, _AG),), ()),
    }
    for kernel, slot in ((K.QKV, "a1"), (K.MLA_DOWN, "a1"), (K.FC1, "a2"),
                         (K.LOGITS, "fln")):  # column-parallel
        sites[(kernel, False)] = ((TpSite(kernel, slot, False, _AG),), ())
        again = (TpSite(kernel, slot, False, _AG, saved=True),) if regather else ()
        sites[(kernel, True)] = (again, (TpSite(kernel, slot, True, _RS),))
    return sites


def mla_sp_sites(q_proj: bool, regather: bool = True) -> Sites:
    """Latent attention's sites with SP, in place of mla_down's: all-gather the normalized
    latents [c_q | c_kv | k_pe] after latent_norm, again (the kept shard) before kv_up's
    backward, reduce-scatter their gradient after q_up's (the last of their consumers in
    backward); `q_proj` (no query compression): q_up reads ln1's output itself, gathered
    as qkv's is; `regather` False: DTensor's, no gather again before a backward."""
    after_q: tuple[TpSite, ...] = (TpSite(K.Q_UP, "latn", True, _RS),)
    sites: Sites = {
        (K.MLA_DOWN, False): ((), ()), (K.MLA_DOWN, True): ((), ()),
        (K.LATENT_NORM, False): ((), (TpSite(K.LATENT_NORM, "latn", False, _AG),)),
        (K.KV_UP, True): ((TpSite(K.KV_UP, "latn", False, _AG, saved=True),)
                          if regather else (), ()),
    }
    if q_proj:
        sites[(K.Q_UP, False)] = ((TpSite(K.Q_UP, "a1", False, _AG),), ())
        sites[(K.Q_UP, True)] = ((TpSite(K.Q_UP, "a1", False, _AG, saved=True),)
                                 if regather else (),
                                 (TpSite(K.Q_UP, "a1", True, _RS), *after_q))
    else:
        sites[(K.Q_UP, True)] = ((), after_q)
    return sites


def add_tensor_parallel(ctx: RankContext, program: Program) -> Program:
    """Insert the TP/SP collectives around the kernels that need them."""
    layout = ctx.layout
    if layout.tp == 1:
        return program
    b, s = layout.micro_batch, ctx.local_model.seq_len  # CP: the rank's s/cp tokens
    model = ctx.local_model
    sizes = {"tp": model.activation_bytes(b), "ce_max": b * s * FP32,
             "ce_sum": 2 * b * s * FP32,
             "tp_latent": b * s * down_width(model) * model.dtype_bytes}
    rec = fp8_recipe(model)
    fp8_gather = model.fp8 and rec.sp_gather
    sizes["tp_fp8"] = b * s * model.hidden * rec.q_act if fp8_gather else sizes["tp"]
    quantized = (rec.q_act, rec.q_weight)  # bytes an FP8/FP4 input and weight element take
    group = layout.group(ctx.rank, Axis.TP)
    regather = regathers(model)  # Megatron/TE's gather again in backward, or DTensor's none
    # (kernel, phase) -> the fields of the collectives before and after it, or (None, sites)
    # where tp_comm_overlap overlaps them with the kernel's GEMM (`traces.plan.overlap`)
    where: dict[tuple[Kernel, Phase | None], tuple[Any, Any]] = {
        key: (tuple(_fields(ctx, c, group, sizes[c[1]]) for c in before),
              tuple(_fields(ctx, c, group, sizes[c[1]]) for c in after))
        for key, (before, after) in _placements(
            layout.sp, model.q_lora_rank == 0 if model.mla and layout.sp else None,
            fp8_gather, regather).items()}
    if layout.sp and not regather:  # DTensor's Shard(1): a copy at each inline gather/scatter
        where = {key: _with_shard_copies(placed, _summed(model, key, sizes["tp"]))
                 for key, placed in where.items()}
    asynctp = model.kernels == "compiled"  # torch.compile's AsyncTP (`traces.plan.overlap`)
    where.update({key: (None, sites) for key, sites in
                  _overlapped(layout.sp, layout.tp_comm_overlap, asynctp, regather).items()})
    templates: dict[tuple[Any, ...], Template] = {}  # one per distinct overlapped kernel op
    recipes: dict[int, list[tuple[list[Any], list[Step]]]] = {}  # by the action's length
    out: Program = []
    for nodes in program:
        signature = list(map(_SIGNATURE, nodes))
        known = recipes.setdefault(len(nodes), [])
        recipe = next((r for sig, r in known if sig == signature), None)
        if recipe is None:
            recipe = _recipe(signature, where)
            known.append((signature, recipe))
        out.append(_splice(nodes, recipe, templates, group, (sizes["tp"], sizes["tp_fp8"]),
                           asynctp, quantized))
    return out


def _summed(model: Any, key: tuple[Kernel, Phase | None], size: float) -> float:
    """Bytes of summing a split GEMM's input gradients (`traces.stack.input_grad_sum`) that
    the shard copy before `key`'s reduce-scatter moves: qkv's and fc1's backward."""
    if key[1] is not Phase.BWD:
        return 0.0
    return float(sum(x for _, x in input_grad_sum(model, key[0], size)[1]))


def _with_shard_copies(placed: tuple[Any, Any], summed: float = 0.0) -> tuple[Any, Any]:
    """The inline collectives before and after a kernel with DTensor's chunk + cat (module
    docstring, shard copies): a copy after each all-gather and before each reduce-scatter,
    reading and writing the collective's buffer; before a reduce-scatter also `summed`
    bytes, the sum of a split GEMM's input gradients that feeds it (`_summed`)."""
    return tuple(tuple(row for collective in rows for row in _shard_copy(collective, summed))
                 for rows in placed)  # type: ignore[return-value]


def _shard_copy(collective: OpRow, summed: float = 0.0) -> tuple[OpRow, ...]:
    """`collective` with its shard copy (`_with_shard_copies`), or alone (an all-reduce)."""
    fields = dict(zip(_ROW_FIELDS, collective))
    kind = fields["kind"]
    if kind not in (_AG, _RS):
        return (collective,)
    size = fields["size_bytes"]
    assert isinstance(size, int | float)
    copy = op_row(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=str(K.TP_SHARD_COPY),
                  purpose=KernelRun(K.TP_SHARD_COPY),
                  mem_bytes=2 * size + (summed if kind is _RS else 0.0),
                  dtype=fields["dtype"])
    return (collective, copy) if kind is _AG else (copy, collective)


_ROW_FIELDS = tuple(f.name for f in dataclasses.fields(Op))
"""The names of an `op_row`'s fields, in its order."""


Step = tuple[int, int, Any, Any]
"""One step of a recipe: (what, position, and two arguments), below."""
_COPY, _AROUND, _REGION, _JOIN = range(4)
_SIGNATURE = attrgetter("op.purpose", "op.phase", "on_compute")
"""What decides the collectives around a node: its kernel and phase (the purpose's), and
whether the next overlapped collective's join may land on it."""


def _recipe(signature: list[Any], where: dict[tuple[Kernel, Phase | None], tuple[Any, Any]]
            ) -> list[Step]:
    """How to insert the collectives into an action whose nodes have `signature`, made once
    per distinct signature (the actions of one stage and direction share it): copy runs of
    nodes that need nothing (`_COPY`, from, to), put inline collectives `_AROUND` a node
    (their fields before and after it), replace a node by its overlapped `_REGION` (its
    sites), and hand the last region's collective (`_JOIN`) to the next compute node."""
    recipe: list[Step] = []
    start, pending = 0, False  # the first node not copied yet; a region since a compute node
    for i, (purpose, phase, on_compute) in enumerate(signature):
        if pending and on_compute:
            recipe.append((_JOIN, i, None, None))
            pending = False
        found = where.get((purpose.kernel, phase)) if isinstance(purpose, KernelRun) else None
        if found is None:
            continue
        if start < i:
            recipe.append((_COPY, start, i, None))
        start = i + 1
        before, after = found
        if before is None:
            recipe.append((_REGION, i, after, None))
            pending = True
        else:
            recipe.append((_AROUND, i, before, after))
    if start < len(signature):
        recipe.append((_COPY, start, len(signature), None))
    return recipe


def _splice(nodes: list[Node], recipe: list[Step], templates: dict[tuple[Any, ...], Template],
            group: tuple[int, ...], size: tuple[float, float], asynctp: bool = False,
            quantized: tuple[float, float] = (1.0, 1.0)) -> list[Node]:
    """The action's nodes with its collectives, by `recipe` (`_recipe` of its signature);
    `size`: the b·s·h buffer, and its bytes when a GEMM's input is gathered in FP8;
    `asynctp`: regions as torch's AsyncTP overlaps them; `quantized`: bytes a quantized
    input and weight element take (`overlap_template`)."""
    step: list[Node] = []
    join: Node | None = None  # an overlapped collective the next compute op waits for
    for what, i, first, second in recipe:
        if what == _COPY:
            step += nodes[i:first]
        elif what == _AROUND:
            node = nodes[i]
            op, unit = node.op, node.unit
            layer, mb, phase = op.layer, op.microbatch, op.phase
            for row in first:
                step.append(Node(stamp_phase(row, layer, mb, phase), unit))
            step.append(node)
            for row in second:
                step.append(Node(stamp_phase(row, layer, mb, phase), unit))
        elif what == _REGION:
            node = nodes[i]
            op = node.op
            key = (op.purpose.kernel, op.phase, op.name, op.flops, op.mem_bytes,  # type: ignore[union-attr]
                   op.gemm, op.dtype)
            template = templates.get(key)
            if template is None:
                sites_before, sites_after = first
                template = templates[key] = overlap_template(op, sites_before, sites_after,
                                                             group, *size, asynctp,
                                                             quantized)
            launch = next(n for n in reversed(step) if n.on_compute)
            region = overlap_region(node, template, launch)
            step += region.nodes
            join = region.join
        elif join is not None:  # _JOIN
            nodes[i].wait_for(join)
            join = None
    assert join is None, "an overlapped kernel ends an action"
    return step


def _overlapped(sp: bool, tp_comm_overlap: bool, asynctp: bool = False, regather: bool = True
                ) -> dict[tuple[Kernel, Phase], tuple[tuple[TpSite, ...], tuple[TpSite, ...]]]:
    """(kernel, phase) -> the TP sites before and after it that tp_comm_overlap overlaps with
    its GEMM (`traces.plan.overlap`); empty without it. AsyncTP leaves qkv's and fc1's
    backward inline: their input gradient is a sum of GEMMs, which micro_pipeline_tp does
    not fuse with the reduce-scatter; so does any stack without the gather again (TE's bulk
    method overlaps that gather with dgrad and the reduce-scatter with wgrad)."""
    if not (sp and tp_comm_overlap):
        return {}
    out = {}
    for (kernel, backward), sites in tp_sites(sp, regather).items():
        if (asynctp or not regather) and backward and kernel in (K.QKV, K.FC1):
            continue
        if kernel in OVERLAPPED:
            for phase in (Phase.BWD,) if backward else (Phase.FWD, Phase.RECOMPUTE):
                out[(kernel, phase)] = sites
    return out


Collective = tuple[OpKind, str, Purpose]
"""A collective to insert: its kind, its label and its purpose."""
Placement = tuple[tuple[Collective, ...], tuple[Collective, ...]]


def _placements(sp: bool, mla_q_proj: bool | None = None, fp8_gather: bool = False,
                regather: bool = True) -> dict[tuple[Kernel, Phase | None], Placement]:
    """(kernel, phase) -> the collectives before and after it; `mla_q_proj` not None: latent
    attention with SP (`mla_sp_sites`); `fp8_gather`: the gathers feeding an FP8 GEMM's cast
    (`traces.plan.fp8.TP_AMAX_GEMMS`) carry FP8 (module docstring, quantized gathers);
    `regather`: the kept shards gathered again in backward (`tp_sites`)."""
    out: dict[tuple[Kernel, Phase | None], Placement] = {}
    sites = tp_sites(sp, regather)
    if mla_q_proj is not None:
        sites = {**sites, **mla_sp_sites(mla_q_proj, regather)}

    def label(site: TpSite) -> str:
        if site.slot == "latn":
            return "tp_latent"
        fp8 = fp8_gather and site.kind is _AG and site.kernel in TP_AMAX_GEMMS[site.grad]
        return "tp_fp8" if fp8 else "tp"

    for (kernel, backward), (before, after) in sites.items():
        phases = (Phase.BWD, *((Phase.WGRAD,) if kernel in WEIGHT_ONLY else ())) if backward \
            else (Phase.FWD, Phase.RECOMPUTE)  # a weight-only backward may run in a W
        for phase in phases:
            out[(kernel, phase)] = (tuple((site.kind, label(site), site) for site in before),
                                    tuple((site.kind, label(site), site) for site in after))
    # The vocab-parallel cross-entropy's reductions (the head is never recomputed).
    logits_before, logits_after = out.get((K.LOGITS, Phase.FWD), ((), ()))
    out[(K.LOGITS, Phase.FWD)] = (logits_before, (*logits_after,
                                                  (_AR, "ce_max", CrossEntropyStat(Stat.MAX))))
    out[(K.CROSS_ENTROPY, Phase.FWD)] = ((), ((_AR, "ce_sum", CrossEntropyStat(Stat.SUM)),))
    return out


def _fields(ctx: RankContext, collective: Collective, group: tuple[int, ...],
            size: float) -> OpRow:
    """An inline collective's row (`traces.ops.op_row`) but layer, micro-batch and phase
    (the kernel's beside)."""
    kind, name, purpose = collective
    dtype = "fp32" if isinstance(purpose, CrossEntropyStat) else ctx.model.data_dtype
    return op_row(kind=kind, stream=Stream.COMPUTE, name="tp" if name == "tp_fp8" else name,
                  purpose=purpose, group=group, size_bytes=size, dtype=dtype)
