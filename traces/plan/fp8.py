"""Pass 2b: what FP8 adds besides its kernels (`traces.fp8`): the amax reductions and the
step's cast of the weights.

With `fp8_recipe = "delayed"`, Transformer Engine all-reduces the amaxes that scale the next
iteration's casts over the amax reduction group — the TP, CP and DP ranks of one pipeline stage
(Megatron-Core's get_amax_reduction_group) — when each fp8_autocast region ends: after every
stage's forward and backward of a micro-batch, on the compute stream (the next kernel waits).
Each carries 4 bytes per amax: 3 per FP8 GEMM forward, 2 backward, over the layers' real FP8
GEMMs (`traces.fp8.fp8_gemms_per_layer`). With "tensorwise" (current scaling) and sequence
parallelism at tp > 1, each cast of a gathered tensor waits for its 4-byte amax all-reduced
over the TP group (TE's with_amax_reduction): forward before qkv's and fc1's input cast,
backward before proj's and fc2's output-gradient cast, on the compute stream between the amax
kernel and the cast (TE waits for it); NVFP4 ("fp4") likewise, its row-wise amax and its
Hadamard column-wise amax in one coalesced 8-byte all-reduce (TE's NVFP4Quantizer::
quantize_impl, allreduce_coalesced of both). Rowwise, blockwise and MXFP8 scales come from the
values they scale: no reduction. Every recipe but rowwise casts every FP8 GEMM weight once a
step (`fp8_weight_cast`), after the optimizer updated them; torchao's rowwise casts them at
each use (`traces.fp8_recipes`). (Under ZeRO-3 the weights are whole only while gathered,
and TE casts them at each use; the plan still counts one cast a step, a lower bound there.)
"""

from __future__ import annotations

from traces.fp8 import AMAX_BYTES, amax_bytes, recipe, weight_cast_bytes
from traces.layout import Axis
from traces.ops import Op, OpKind, Phase, Stream
from traces.pipeline import Action
from traces.plan.nodes import Node, Program, RankContext
from traces.purpose import AmaxReduction, Kernel, KernelRun, ParamGather

TP_AMAX_GEMMS = {False: frozenset({Kernel.QKV, Kernel.FC1}),
                 True: frozenset({Kernel.PROJ, Kernel.FC2})}
"""(backward?) -> the GEMMs whose cast input TE gathers under SP: the column-parallel inputs
forward, the row-parallel output gradients backward. Latent attention's kv_up and q_up take
latents Megatron-Core gathers itself (gather_from_sequence_parallel_region, in bf16), so
their casts reduce nothing; q_up reading ln1's output (no q_lora_rank) is TE's to gather."""


def add_fp8(ctx: RankContext, actions: list[Action], program: Program) -> Program:
    """After each action's compute ops, its amax all-reduce (delayed scaling); current
    scaling's TP amax reductions; after the optimizer (and ZeRO-1/2's parameter gathers), the
    weight cast. Runs after `add_optimizer`."""
    model, layout = ctx.model, ctx.layout
    if not model.fp8:
        return program
    if recipe(model).tp_amax and layout.sp and layout.tp > 1:
        group = layout.group(ctx.rank, Axis.TP)
        q_proj = frozenset({Kernel.Q_UP} if model.mla and not model.q_lora_rank else ())
        gemms = {False: TP_AMAX_GEMMS[False] | q_proj, True: TP_AMAX_GEMMS[True]}
        amaxes = AMAX_BYTES * (2 if recipe(model).rht else 1)
        program = [_tp_amax(nodes, group, gemms, amaxes) for nodes in program[:-1]] + \
            [program[-1]]
    group = amax_group(ctx)
    out: Program = []
    for nodes, action in zip(program[:-1], actions):
        layers = layout.layers_of_stage(model, action.stage)
        last = next((n for n in reversed(nodes) if n.op.kind is OpKind.COMPUTE), None)
        size = amax_bytes(model, layers, backward=last is not None and
                          last.op.phase is Phase.BWD, ep=layout.ep)
        if last is None or not size or len(group) == 1 or last.op.phase is Phase.WGRAD:
            out.append(nodes)
            continue
        at = nodes.index(last) + 1
        op = Op(kind=OpKind.ALL_REDUCE, stream=Stream.COMPUTE, name="amax",
                purpose=AmaxReduction(), group=group, size_bytes=size,
                microbatch=last.op.microbatch, phase=last.op.phase, dtype="fp32")
        out.append([*nodes[:at], Node(op, None, [last]), *nodes[at:]])
    return [*out, _with_weight_cast(ctx, program[-1])]


def _with_weight_cast(ctx: RankContext, end: list[Node]) -> list[Node]:
    """The end of the step with the weight cast after the optimizer (none where the recipe
    casts weights at each use)."""
    model, layout = ctx.model, ctx.layout
    layers = [i for stage in layout.stages_of_rank(ctx.pp_rank)
              for i in layout.layers_of_stage(model, stage)]
    size = weight_cast_bytes(model, layers, layout.tp, layout.ep, layout.etp)
    if not size:
        return end
    cast = Op(kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=str(Kernel.FP8_WEIGHT_CAST),
              purpose=KernelRun(Kernel.FP8_WEIGHT_CAST), phase=Phase.OPT, mem_bytes=size)
    gathers = [n for n in end if isinstance(n.op.purpose, ParamGather)]
    return [*end, Node(cast, None, gathers)]


def _tp_amax(nodes: list[Node], group: tuple[int, ...],
             gemms: dict[bool, frozenset[Kernel]], size: int = AMAX_BYTES) -> list[Node]:
    """`nodes` with a `size`-byte amax all-reduce over `group` after each amax kernel whose
    cast feeds a GEMM of `gemms` (per phase: the next GEMM op on the compute stream)."""
    following: list[object] = []  # per node, the purpose of the next GEMM op after it
    gemm: object = None
    for node in reversed(nodes):
        following.append(gemm)
        gemm = node.op.purpose if node.op.gemm else gemm
    out: list[Node] = []
    amax = KernelRun(Kernel.FP8_AMAX)
    for node, gemm in zip(nodes, reversed(following)):
        out.append(node)
        backward = node.op.phase is Phase.BWD
        if node.op.purpose == amax and getattr(gemm, "kernel", None) in gemms[backward]:
            op = Op(kind=OpKind.ALL_REDUCE, stream=Stream.COMPUTE, name="amax",
                    purpose=AmaxReduction(), group=group, size_bytes=size,
                    microbatch=node.op.microbatch, phase=node.op.phase, dtype="fp32",
                    layer=node.op.layer)
            out.append(Node(op, node.unit, [node]))
    return out


def amax_group(ctx: RankContext) -> tuple[int, ...]:
    """The ranks of this rank's pipeline stage, its TP, CP and DP peers: with PP slowest in the
    rank order (`traces.layout`), the stage's block of world/pp consecutive ranks."""
    per_stage = ctx.layout.world // ctx.layout.pp
    first = ctx.pp_rank * per_stage
    return tuple(range(first, first + per_stage))
