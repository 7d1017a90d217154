"""Pass 2b: context parallelism — attention over the whole sequence from s/cp tokens a rank.

Megatron-Core with Transformer Engine's context-parallel attention: the sequence is cut into
2·cp chunks and CP rank i holds chunks i and 2·cp − 1 − i, so that under the causal mask every
rank has the same attention work (the early chunk sees few keys, the late one many). Every
kernel but the attention core runs on the rank's s/cp tokens (`RankContext.local_model`:
compute, TP and pipeline sizes all shrink by cp); the attention core needs every rank's keys
and values, and this pass brings them (`cp_comm`):

    p2p (default; TE's AttnFuncWithCPAndKVP2P)
        forward (and recompute): cp ring steps; step i attends the rank's queries to the K/V
        block it holds while that block goes on to the next CP rank and the next one comes in
        from the previous: cp − 1 sends and receives of one K/V block (b·(s/cp)·2·kv_width/t
        elements), step i + 1 waiting for receive i. Each step is one flash kernel of s/cp
        queries against s/cp keys, half of 4·b·(a/t)·(s/cp)²·d FLOPs under the causal
        mask on every step (the diagonal step runs two triangles and one full block of
        its 2 × 2 chunk blocks; an earlier rank's K/V meets both query chunks' first half,
        a later rank's only the late chunk), so the cp steps do the whole causal core
        divided by cp (`traces.kernels.FLASH_CAUSAL`).
        backward: the ring runs the other way (to the previous rank), in the forward's reverse
        order, the diagonal block last: cp messages, the first carrying K/V only, the middle
        ones K/V and the dK/dV accumulated for that block so far, the last dK/dV only —
        (cp − 1) K/V and (cp − 1) dK/dV in all; step m waits for message m − 1, message m
        for step m − 1 (its dK/dV), and the kernel after the core (qkv's backward) for the
        last message (the rank's own dK/dV).
    all_gather (the Llama 3 paper §3.3.2; TE's AttnFuncWithCPAndKVAllGather)
        forward: one all-gather of K/V over the CP group (inline, the kernels wait), then one
        kernel of s/cp queries against all s keys (cp times a ring step's FLOPs, reading the
        other cp − 1 blocks too). backward: K/V gathered again (TE keeps only the rank's own
        K/V for backward), the kernel's backward (reading the gathered K/V, writing dK/dV for
        all of it), and a reduce-scatter of dK/dV over the CP group. Open: torch's stacks do
        not reduce-scatter; _templated_ring_attention_backward passes dK/dV round the ring
        (`dkv_rotater = _create_rotater(group, 2, method=_RotateMethod.ALL_TO_ALL)`, fp32,
        one permute_tensor to the next rank after each of the cp steps, each waited at the
        next step's accumulation, the last before the core returns), so only the last
        block's transfer is exposed; here the whole reduce-scatter is, inline.

Each ring step's result is merged into the rank's (`Kernel.CP_MERGE`, memory-bound, one
kernel after each step; after the gathered kernel in all_gather mode for torch's stacks):

    fused (Transformer Engine, transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py, AttnFuncWithCPAndKVP2P): forward flash_attn_fwd_out_correction,
        out.add_(out_per_step · exp(lse_per_step − lse)): reads out and the step's output,
        writes out, 3e a query element, and flash_attn_fwd_softmax_lse_correction on the fp32
        log-sum-exp (read both, write one: 12 bytes a query row), with the out correction's two
        log-sum-exp reads (8); backward dq.add_(dq_) (3e a query element) and
        dkv.add_(dkv_) (3e a K/V element of the block).
    eager, compiled (PyTorch's _templated_ring_attention, _SDPAMerger with convert_to_f32):
        forward the step's output cast to fp32 (e + 4 a query element), then out − sigmoid(
        block_lse − lse)·(out − block_out) in three fp32 kernels (12 + 8 + 12), and the final
        cast back (4 + e); torch.cat of K and V for the next step (2e a K/V element);
        backward grad_query += (4 + e + 4 a query element), grad_key, grad_value += (the same
        a K/V element), torch.cat of the fp32 dK/dV to send (8) and of K/V (2e).

Under the causal mask with load balancing a step after the rank's own (i > rank) computes only
the late query chunk (half the queries) against the whole block, one at or before it (0 < i ≤
rank) all queries against the block's early chunk (half the K/V); the merge touches those,
so it differs between the CP ranks: each is charged the busiest rank's (`merge_bytes`).
In all_gather mode Transformer Engine (AttnFuncWithCPAndKVAllGather) runs the rank's two
query chunks against their own key ranges and merges nothing.

Sizes follow nccl-tests: an all-gather's output, a reduce-scatter's input (cp · one block).
K/V's width per TP rank is the QKV GEMM's output width less the queries' h/t, so grouped-query
attention's narrower K/V carry through — in the fused stack. torch's stacks (`[model] kernels =
"eager" | "compiled"`, torchtitan) repeat K and V to the query heads before
F.scaled_dot_product_attention (torchtitan/models/llama3/model.py, Attention.forward:
`keys = repeat_kv(xk, self.n_rep)` ahead of `self.sdpa(xq, xk, xv)`), and PyTorch's context
parallelism takes over that sdpa call (torch/distributed/tensor/experimental/_context_parallel/
_attention.py, `_templated_ring_attention`): it moves K/V at a/t heads, and in backward it
accumulates and sends dK/dV in fp32 (`_ContextParallelOptions.convert_to_f32 = True`,
`accum_dtype = torch.float32`, `next_grad_kv = torch.cat([grad_key, grad_value])`).
Gradients are then reduced over DP × CP (`traces.plan.data`), as Megatron-Core's data-parallel
group with context parallelism.
"""

from __future__ import annotations

import dataclasses

from traces.kernels import layer_kernels
from traces.layout import Axis, CpComm
from traces.mla import qk_dim, v_dim
from traces.model import ModelSpec
from traces.ops import Op, OpKind, OpRow, Phase, Stream, op_row, row_of, stamp, stamp_phase
from traces.plan.nodes import Node, Program, RankContext
from traces.purpose import CpGather, CpRing, Kernel, KernelRun

_FLASH = Kernel.FLASH_ATTN
FP32_BYTES = 4
"""Bytes of an fp32 element (IEEE 754 binary32)."""
TAG_FORWARD, TAG_BACKWARD = "cp", "cp_grad"


def kv_block_bytes(ctx: RankContext) -> float:
    """Bytes of one K/V block: b·(s/cp) tokens x K and V's width on this TP rank (the QKV
    GEMM's N less the queries' ad/t), in the model's dtype; in torch's stacks K and V repeated
    to the a/t query heads first, 2·ad/t (module docstring). Latent attention's core takes the
    up-projected K and V: a/t heads of d + r and of d_v (`traces.mla`)."""
    model, layout = ctx.local_model, ctx.layout
    if model.mla:
        tokens = layout.micro_batch * model.seq_len
        width = model.heads // layout.tp * (qk_dim(model) + v_dim(model))
        return tokens * width * model.dtype_bytes
    kernels = layer_kernels(model, layout.micro_batch, layout.tp, layout.sp, ctx.grad_bytes)
    qkv = next(k.gemm for k in kernels if k.name is Kernel.QKV)
    assert qkv is not None, "the QKV projection is a GEMM"
    _, tokens, width, _ = qkv
    q = model.q_width // layout.tp
    kv = 2 * q if repeats_kv(ctx) else width - q
    return tokens * kv * model.dtype_bytes


def merge_bytes(ctx: RankContext, block: int, backward: bool, last: bool = False) -> float:
    """HBM bytes of the merge after ring step `block` (0: the rank's own, the diagonal), the
    most any rank of the CP group moves there (`merge_bytes_at`); `last`: the forward's final
    cast (torch's stacks). Under load balancing the ranks' merges differ (which half of the
    queries or K/V a step touches depends on the rank's place in the ring) while their cores
    do not; each layer's ring paces every CP rank to the slowest, and charging each rank the
    busiest one's merges keeps the CP ranks alike, so one stands for all (`traces.cp_fold`)."""
    return max(merge_bytes_at(ctx, me, block, backward, last) for me in range(ctx.layout.cp))


def merge_bytes_at(ctx: RankContext, me: int, block: int, backward: bool,
                   last: bool = False) -> float:
    """HBM bytes of the merge after ring step `block` on the CP group's rank `me` (module
    docstring)."""
    model, layout = ctx.local_model, ctx.layout
    e = model.dtype_bytes
    tokens = layout.micro_batch * model.seq_len
    heads = model.heads // layout.tp
    queries = tokens * (heads * v_dim(model) if model.mla else model.q_width // layout.tp)
    kv = kv_block_bytes(ctx) / e  # elements
    q_share = 1.0 if block <= me else 0.5
    kv_share = 0.5 if 0 < block <= me else 1.0
    if not repeats_kv(ctx):  # Transformer Engine
        if backward:
            return 3 * e * (queries * q_share + kv * kv_share)
        return (3 * e * queries + (12 + 8) * tokens * heads) * q_share
    f = FP32_BYTES
    if backward:
        return (2 * f + e) * (queries * q_share + kv * kv_share) + 2 * f * kv + 2 * e * kv
    merge = (e + f) * queries if block == 0 else \
        ((e + f) + 3 * f + 2 * f + 3 * f) * queries * q_share + 2 * e * kv
    return merge + ((f + e) * queries if last else 0.0)


def repeats_kv(ctx: RankContext) -> bool:
    """Whether the attention core's K/V reach context parallelism at the query heads
    (`stack_repeats_kv`)."""
    return stack_repeats_kv(ctx.local_model)


def stack_repeats_kv(model: ModelSpec) -> bool:
    """Whether `model`'s K/V reach context parallelism at the query heads: torch's stacks
    (module docstring), for standard attention (latent attention's are per head)."""
    return model.kernels != "fused" and not model.mla


def grad_kv_bytes(ctx: RankContext) -> float:
    """Bytes of one block's dK/dV as context parallelism sends them: K/V's, in fp32 where
    torch's context parallelism accumulates them (module docstring), else in the model's dtype."""
    kv = kv_block_bytes(ctx)
    return kv * FP32_BYTES / ctx.local_model.dtype_bytes if repeats_kv(ctx) else kv


def add_context_parallel(ctx: RankContext, program: Program) -> Program:
    """Replace each attention core by its CP form (module docstring)."""
    if ctx.layout.cp == 1:
        return program
    ring = _Ring(ctx)
    out = [ring.step(nodes) for nodes in program]
    replaced = ring.replaced
    if not replaced:
        return out
    cores = replaced.keys()
    for nodes in out:  # what waited for a replaced core (an overlapped proj's chunks) waits
        for node in nodes:  # for the last op of its CP form (the test in C: ~10^5 nodes)
            after = node.after
            if after and not cores.isdisjoint(map(id, after)):
                node.after = [replaced.get(id(n), n) for n in after]
    return out


class _Ring:
    def __init__(self, ctx: RankContext) -> None:
        layout = ctx.layout
        self.ctx, self.cp = ctx, layout.cp
        self.kv = kv_block_bytes(ctx)
        self.grad_kv = grad_kv_bytes(ctx)
        self.merge_dtype = ctx.local_model.data_dtype
        group = layout.group(ctx.rank, Axis.CP)
        self.group = group
        me = group.index(ctx.rank)
        self.next, self.prev = group[(me + 1) % self.cp], group[(me - 1) % self.cp]
        self.p2p = layout.cp_comm is CpComm.P2P
        self.replaced: dict[int, Node] = {}
        """id of each replaced attention core -> the last op of its CP form."""
        self.merges: dict[tuple[int, bool, bool], float] = {}
        """`merge_bytes` by (block, backward, last): the same for every layer of this rank."""
        self.merge_rows: dict[float, OpRow] = {}
        """The merge op's fields by its bytes, stamped per layer, micro-batch and phase."""
        self.message_rows: dict[tuple[int, bool], tuple[OpRow, OpRow]] = {}
        """The (send, receive) ops' fields of ring message (i, backward), stamped likewise:
        one row per message of the ring, not one `Op(...)` per layer and micro-batch."""

    def merge(self, block: int, backward: bool, last: bool) -> float:
        """`merge_bytes` of this rank, worked out once per (block, backward, last)."""
        key = (block, backward, last)
        if key not in self.merges:
            self.merges[key] = merge_bytes(self.ctx, block, backward, last=last)
        return self.merges[key]

    def step(self, nodes: list[Node]) -> list[Node]:
        out: list[Node] = []
        waiting: list[Node] = []  # what the next compute op must wait for
        for node in nodes:
            purpose = node.op.purpose  # not a flash core (the test without dataclass __eq__)
            if type(purpose) is not KernelRun or purpose.kernel is not _FLASH:
                if waiting and node.on_compute:
                    node.wait_first(waiting)
                    waiting = []
                out.append(node)
                continue
            before = next((n for n in reversed(out) if n.on_compute), None)
            if self.p2p:
                made, waiting = self._ring(node, before)
            else:
                made = self._gathered(node, before)
            self.replaced[id(node)] = made[-1]
            out += made
        assert not waiting, "a backward ring is followed by its qkv backward"
        return out

    # --- p2p -------------------------------------------------------------------------------

    def _ring(self, core: Node, before: Node | None) -> tuple[list[Node], list[Node]]:
        """The ring of one core; and what the kernel after it waits for."""
        backward = core.op.phase is Phase.BWD
        out: list[Node] = []
        recv: Node | None = None
        step: Node | None = None
        messages = self.cp if backward else self.cp - 1
        row = row_of(core.op)  # each step's core: a copy of it
        layer, microbatch = core.op.layer, core.op.microbatch
        for i in range(self.cp):
            recv_next: Node | None = recv
            if i < messages:
                send_after = [before] if i == 0 and before is not None else \
                    [n for n in (recv, step if backward else None) if n is not None]
                send, recv_next = self._message(core, i, backward, send_after)
                out += [send, recv_next]
            kernel = Node(stamp(row, layer, microbatch), core.unit,
                          [recv] if recv is not None else list(core.after))
            block = self.cp - 1 - i if backward else i  # backward: the diagonal last
            step = self._merge(core, self.merge(block, backward, i == self.cp - 1), kernel)
            out += [kernel, step]
            recv = recv_next
        return out, ([recv] if backward and recv is not None else [])

    def _message(self, core: Node, i: int, backward: bool, after: list[Node]
                 ) -> tuple[Node, Node]:
        op = core.op
        rows = self.message_rows.get((i, backward))
        if rows is None:
            rows = self.message_rows[(i, backward)] = self._message_rows(i, backward)
        send_row, recv_row = rows
        send = Node(stamp_phase(send_row, op.layer, op.microbatch, op.phase), core.unit, after)
        recv = Node(stamp_phase(recv_row, op.layer, op.microbatch, op.phase), core.unit)
        return send, recv

    def _message_rows(self, i: int, backward: bool) -> tuple[OpRow, OpRow]:
        """The fields of ring message i's send and receive but layer, micro-batch and phase."""
        if not backward:
            size, to, source, tag = self.kv, self.next, self.prev, TAG_FORWARD
        else:  # K/V at the first message, dK/dV at the last, both between
            size = (self.kv if i < self.cp - 1 else 0) + (self.grad_kv if i > 0 else 0)
            to, source, tag = self.prev, self.next, TAG_BACKWARD

        def message(kind: OpKind, stream: Stream, peer: int) -> OpRow:
            return op_row(kind=kind, stream=stream, name=tag, purpose=CpRing(i, backward),
                          peer=peer, size_bytes=size, tag=tag, dtype=self.ctx.model.dtype)

        return (message(OpKind.SEND, Stream.CP_SEND, to),
                message(OpKind.RECV, Stream.CP_RECV, source))

    def _merge(self, core: Node, size: float, after: Node) -> Node:
        op = core.op
        row = self.merge_rows.get(size)
        if row is None:
            row = self.merge_rows[size] = op_row(
                kind=OpKind.COMPUTE, stream=Stream.COMPUTE, name=str(Kernel.CP_MERGE),
                purpose=KernelRun(Kernel.CP_MERGE), mem_bytes=size, dtype=self.merge_dtype)
        return Node(stamp_phase(row, op.layer, op.microbatch, op.phase), core.unit, [after])

    # --- all-gather ----------------------------------------------------------------------

    def _gathered(self, core: Node, before: Node | None) -> list[Node]:
        """All-gather K/V, the core over the whole sequence, and in backward the
        reduce-scatter of dK/dV. Under torch's stacks the gather runs beside the rank's own
        (diagonal) step: PyTorch's _AllGatherRotater issues it asynchronously at step 0
        (exchange_buffers) and waits for it at step 1 (next_buffer), and the other cp − 1
        blocks then run, each merged (`merge_bytes`)."""
        op, cp, kv = core.op, self.cp, self.kv
        backward = op.phase is Phase.BWD
        others = (cp - 1) * kv  # the other ranks' K/V, read (and, backward, their dK/dV written)
        wide = dataclasses.replace(op, flops=op.flops * cp, draws=op.draws * cp,
                                   mem_bytes=op.mem_bytes + (2 if backward else 1) * others)
        if not repeats_kv(self.ctx):
            out = [self._collective(op, OpKind.ALL_GATHER, CpGather(False), core),
                   Node(wide, core.unit, core.after)]
        else:
            inputs = [before] if before is not None else list(core.after)
            gather = self._collective(op, OpKind.ALL_GATHER, CpGather(False), core,
                                      Stream.CP_RECV, inputs)
            own = Node(dataclasses.replace(op), core.unit, list(core.after))
            rest = Node(dataclasses.replace(op, flops=op.flops * (cp - 1),
                                            draws=op.draws * (cp - 1),
                                            mem_bytes=wide.mem_bytes - op.mem_bytes),
                        core.unit, [own, gather])
            size = sum(self.merge(i, backward, i == cp - 1) for i in range(cp))
            out = [gather, own, rest, self._merge(core, size, rest)]
        if backward:
            out.append(self._collective(op, OpKind.REDUCE_SCATTER, CpGather(True), core))
        return out

    def _collective(self, op: Op, kind: OpKind, purpose: CpGather, core: Node,
                    stream: Stream = Stream.COMPUTE, after: list[Node] | None = None) -> Node:
        grads = kind is OpKind.REDUCE_SCATTER
        block = self.grad_kv if grads else self.kv
        dtype = "fp32" if grads and repeats_kv(self.ctx) else self.ctx.model.dtype
        return Node(Op(kind=kind, stream=stream, name="cp", purpose=purpose,
                       group=self.group, size_bytes=self.cp * block, layer=op.layer,
                       microbatch=op.microbatch, phase=op.phase, dtype=dtype),
                    core.unit, after)
