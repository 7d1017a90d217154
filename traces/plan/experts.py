"""Pass 2b: expert parallelism — each MoE layer's dispatch and combine all-to-alls.

On the compute stream (Megatron-Core's MoEAlltoAllTokenDispatcher blocks on them), per MoE
layer (`traces.moe` lists the kernels):

    forward     permute, dispatch all-to-all, [ETP all-gather], expert_fc1 ... expert_fc2,
                [ETP reduce-scatter], combine all-to-all, unpermute
    backward    unpermute, combine's all-to-all of the gradients, [ETP all-gather],
                expert_fc2 ... expert_fc1, [ETP reduce-scatter], dispatch's all-to-all of
                the gradients, permute

An all-to-all runs over the rank's EP group (`traces.expert_grid.ep_group`) with the rank's
whole send buffer, A·h·e bytes for its A kept token assignments (nccl-tests' size). Balanced,
each peer gets A·h·e / EP. Under skewed routing (`routing_skew` > 0) the op carries its
per-peer sizes (`Op.split`, `traces.alltoallv`): the dispatch sends EP rank j the tokens its
experts get, dispatch_tokens[j]·h·e, from every rank (`traces.moe.dispatch_matrix`, rows
equal: sizes per receiver); the combine returns them, the transpose (sizes per sender). In
backward the combine's gradient exchange has the dispatch's shape and the dispatch's the
combine's. The mean buffer stays A·h·e, so only the network sees the imbalance, beside the
busiest EP rank's expert GEMMs, which the combine waits for. The ETP collectives move the
R·h·e tokens the rank's experts process.

With HybridEP (`dispatch = "hybridep"`) each forward (and recomputed) dispatch is preceded
by the all-gather of the rank's routing map over the EP group, `RoutingMapGather`, EP·T·E
bytes (nccl-tests' all_gather size, one bool per token and expert): HybridEPBuffer's
dispatch_with_permute, called without a handle as Megatron-Core's forward does, runs
`torch.distributed.all_gather_into_tensor(global_routing_map, routing_map, self.group)` and
its metadata preprocessing kernel on the gathered map before the dispatch, and reads the
received count on the host (`.cpu()`, the host model's sync); the backward passes the handle
and gathers nothing (deepseek-ai/DeepEP deep_ep/hybrid_ep_buffer.py @017a520,
dispatch_with_permute; NVIDIA/Megatron-LM megatron/core/transformer/moe/fused_a2a.py
@02ad939, HybridEPDispatch.forward). The preprocessing kernel itself is not listed.

`add_expert_grads` (after the data pass) reduces the routed experts' gradients over the
expert-data-parallel group; the data pass reduces the rest of an MoE layer over DP x CP.
"""

from __future__ import annotations

from traces.alltoallv import AllToAllv, deepep_split, split_of
from traces.expert_grid import ep_coord, ep_group, etp_group, expert_grad_group
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe import (
    ExpertShard,
    dispatch_tokens,
    local_expert_tokens,
    rank_tokens,
    skewed_experts,
)
from traces.moe_groups import FORWARDING
from traces.moe_spec import expert_counts, is_moe_layer
from traces.ops import Op, OpKind, Phase, Stream
from traces.pipeline import Action
from traces.plan.nodes import Node, Program, RankContext
from traces.purpose import (
    ExpertAllToAll,
    ExpertGrads,
    ExpertTp,
    Kernel,
    KernelRun,
    MoeStep,
    Purpose,
    RoutingMapGather,
)
from traces.zero_bubble import splits_backward

K = Kernel
_A2A, _AG, _RS = OpKind.ALL_TO_ALL, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER
D, C = MoeStep.DISPATCH, MoeStep.COMBINE
Exchange = tuple[OpKind, Purpose, bool]
"""A collective to insert: its kind, its purpose, over the EP (true) or the ETP group."""

# (kernel, backward) -> the exchanges right before and right after it (module docstring)
_SITES: dict[tuple[Kernel, bool], tuple[tuple[Exchange, ...], tuple[Exchange, ...]]] = {
    (K.PERMUTE, False): ((), ((_A2A, ExpertAllToAll(D, False), True),
                              (_AG, ExpertTp(D, False), False))),
    (K.UNPERMUTE, False): (((_RS, ExpertTp(C, False), False),
                            (_A2A, ExpertAllToAll(C, False), True)), ()),
    (K.UNPERMUTE, True): ((), ((_A2A, ExpertAllToAll(C, True), True),
                               (_AG, ExpertTp(C, True), False))),
    (K.PERMUTE, True): (((_RS, ExpertTp(D, True), False),
                         (_A2A, ExpertAllToAll(D, True), True)), ()),
}

_SITE_KERNELS = frozenset(kernel for kernel, _ in _SITES)
"""The kernels some EP site is beside (`add_expert_parallel` looks no further for others)."""


def add_expert_parallel(ctx: RankContext, program: Program) -> Program:
    """Insert the EP all-to-alls (and ETP collectives) around each MoE layer's experts."""
    layout, model = ctx.layout, ctx.local_model
    if not model.experts or (layout.ep == 1 and layout.etp == 1):
        return program
    groups = {True: ep_group(layout, ctx.rank), False: etp_group(layout, ctx.rank)}
    shard = ExpertShard(ep=layout.ep, etp=layout.etp, ep_rank=ep_coord(layout, ctx.rank))
    tokens = rank_tokens(model, layout.micro_batch, layout.tp)
    row = model.hidden * model.dtype_bytes
    sizes: dict[int, tuple[float, float]] = {}
    splits: dict[int, AllToAllv | None] = {}
    skewed = skewed_experts(model, layout)
    deep = model.dispatch in FORWARDING
    hybrid = model.dispatch == "hybridep"

    def size(layer: int, ep: bool) -> float:
        if layer not in sizes:
            sizes[layer] = (sum(expert_counts(model, layer, tokens)) * row,
                            sum(local_expert_tokens(model, layer, tokens, shard)) * row)
        return sizes[layer][0 if ep else 1]

    def split(layer: int, purpose: Purpose) -> AllToAllv | None:
        """The dispatch's per-receiver sizes (rows equal), or for a combine (and the
        dispatch's gradients) their transpose; None when balanced."""
        if not (skewed or deep) or not isinstance(purpose, ExpertAllToAll):
            return None
        if layer not in splits:
            sizes = [float(n * row) for n in dispatch_tokens(model, layer, tokens, layout.ep)]
            splits[layer] = deepep_split(
                model, expert_counts(model, layer, tokens), tokens, row, sizes) if deep else \
                split_of(sizes, by_sender=False)
        found = splits[layer]
        reverse = (purpose.step is C) != purpose.grad  # combine forward, dispatch backward
        return found.transpose() if found is not None and reverse else found

    out: Program = []
    for nodes in program:
        step: list[Node] = []
        for node in nodes:
            op = node.op
            purpose = op.purpose
            # Most ops run no site's kernel: passed on after two tests (KernelRun is final).
            if type(purpose) is not KernelRun or purpose.kernel not in _SITE_KERNELS:
                step.append(node)
                continue
            found = _SITES.get((purpose.kernel, op.phase is Phase.BWD))
            if found is None or op.layer is None or op.phase is Phase.WGRAD \
                    or not is_moe_layer(model, op.layer):
                step.append(node)
                continue
            layer = op.layer
            before, after = ([_op(node, x, groups[x[2]], size(layer, x[2]), model.data_dtype,
                                  split(layer, x[1]))
                              for x in side if len(groups[x[2]]) > 1] for side in found)
            if hybrid and purpose.kernel is K.PERMUTE and op.phase is not Phase.BWD \
                    and len(groups[True]) > 1:
                before.append(_op(node, (_AG, GATHER, True), groups[True],
                                  routing_map_bytes(model, tokens, layout.ep), "bool", None))
            step += [*before, node, *after]
        out.append(step)
    return out


GATHER = RoutingMapGather()
"""The one routing-map gather purpose (it has no fields)."""


def routing_map_bytes(model: ModelSpec, tokens: int, ep: int) -> float:
    """HybridEP's gathered routing map (module docstring): `ep` members' `tokens` x experts
    bools, nccl-tests' all_gather size (the output)."""
    return float(ep * tokens * model.experts)


def add_expert_grads(ctx: RankContext, actions: list[Action], program: Program) -> Program:
    """Reduce each MoE layer's routed-expert gradients over the expert-data-parallel group
    right after the layer's last backward op of the last micro-batch (ZeRO 0: all-reduce;
    1/2: reduce-scatter), on the DP stream, as Megatron-Core's expert data-parallel
    gradient buffers do."""
    layout = ctx.layout
    group = expert_grad_group(layout, ctx.rank)
    if not ctx.model.experts or len(group) == 1 or fsdp_experts(layout):
        return program  # (under ZeRO 3 the data pass reduces them per unit)
    kind = OpKind.ALL_REDUCE if layout.zero == 0 else OpKind.REDUCE_SCATTER
    out: Program = []
    for action, nodes in zip(actions, program, strict=False):
        if action.kind != ("W" if splits_backward(layout.schedule) else "B") \
                or not ctx.ends_chunk(action.microbatch):
            out.append(nodes)
            continue
        last = {node.op.layer: i for i, node in enumerate(nodes)
                if node.on_compute and node.op.layer is not None}
        step: list[Node] = []
        for i, node in enumerate(nodes):
            step.append(node)
            layer = node.op.layer
            if layer is None or last.get(layer) != i or not is_moe_layer(ctx.model, layer):
                continue
            assert node.unit is not None
            step.append(Node(Op(kind=kind, stream=Stream.DP, name="expert_grads",
                                purpose=ExpertGrads(node.unit), group=group,
                                size_bytes=ctx.expert_params(layer) * ctx.grad_bytes,
                                layer=layer, microbatch=node.op.microbatch, phase=Phase.BWD,
                                dtype=ctx.grad_dtype), node.unit, [node]))
        out.append(step)
    return [*out, *program[len(actions):]]


def fsdp_experts(layout: Layout) -> bool:
    """ZeRO 3 over a DP group of two or more: the data pass gathers the experts before use and
    reduce-scatters their gradients per unit (`traces.plan.data`)."""
    return layout.zero == 3 and layout.data_degree > 1


def _op(beside: Node, exchange: Exchange, group: tuple[int, ...], size: float,
        dtype: str, split: AllToAllv | None) -> Node:
    kind, purpose, ep = exchange
    op = beside.op
    assert split is None or split.mean_send_bytes == size, "a split adds up to the buffer"
    made = Op(kind=kind, stream=Stream.COMPUTE, name="ep" if ep else "etp",
              purpose=purpose, group=group, size_bytes=size, layer=op.layer,
              microbatch=op.microbatch, phase=op.phase, dtype=dtype, split=split)
    return Node(made, beside.unit)
