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
        all of it), and a reduce-scatter of dK/dV over the CP group.

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
from traces.ops import Op, OpKind, Phase, Stream
from traces.plan.nodes import Node, Program, RankContext
from traces.purpose import CpGather, CpRing, Kernel, KernelRun

_CORE = KernelRun(Kernel.FLASH_ATTN)
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


def repeats_kv(ctx: RankContext) -> bool:
    """Whether the attention core's K/V reach context parallelism at the query heads: torch's
    stacks (module docstring), for standard attention (latent attention's are per head)."""
    return ctx.local_model.kernels != "fused" and not ctx.local_model.mla


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
    for nodes in out:  # what waited for a replaced core (an overlapped proj's chunks) waits
        for node in nodes:  # for the last op of its CP form
            if any(id(n) in ring.replaced for n in node.after):
                node.after = [ring.replaced.get(id(n), n) for n in node.after]
    return out


class _Ring:
    def __init__(self, ctx: RankContext) -> None:
        layout = ctx.layout
        self.ctx, self.cp = ctx, layout.cp
        self.kv = kv_block_bytes(ctx)
        self.grad_kv = grad_kv_bytes(ctx)
        group = layout.group(ctx.rank, Axis.CP)
        self.group = group
        me = group.index(ctx.rank)
        self.next, self.prev = group[(me + 1) % self.cp], group[(me - 1) % self.cp]
        self.p2p = layout.cp_comm is CpComm.P2P
        self.replaced: dict[int, Node] = {}
        """id of each replaced attention core -> the last op of its CP form."""

    def step(self, nodes: list[Node]) -> list[Node]:
        out: list[Node] = []
        waiting: list[Node] = []  # what the next compute op must wait for
        for node in nodes:
            if node.op.purpose != _CORE:
                if waiting and node.on_compute:
                    node.wait_first(waiting)
                    waiting = []
                out.append(node)
                continue
            before = next((n for n in reversed(out) if n.on_compute), None)
            if self.p2p:
                made, waiting = self._ring(node, before)
            else:
                made = self._gathered(node)
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
        for i in range(self.cp):
            recv_next: Node | None = recv
            if i < messages:
                send_after = [before] if i == 0 and before is not None else \
                    [n for n in (recv, step if backward else None) if n is not None]
                send, recv_next = self._message(core, i, backward, send_after)
                out += [send, recv_next]
            step = Node(dataclasses.replace(core.op), core.unit,
                        [recv] if recv is not None else list(core.after))
            out.append(step)
            recv = recv_next
        return out, ([recv] if backward and recv is not None else [])

    def _message(self, core: Node, i: int, backward: bool, after: list[Node]
                 ) -> tuple[Node, Node]:
        op = core.op
        if not backward:
            size, to, source, tag = self.kv, self.next, self.prev, TAG_FORWARD
        else:  # K/V at the first message, dK/dV at the last, both between
            size = (self.kv if i < self.cp - 1 else 0) + (self.grad_kv if i > 0 else 0)
            to, source, tag = self.prev, self.next, TAG_BACKWARD
        def message(kind: OpKind, stream: Stream, peer: int) -> Op:
            return Op(kind=kind, stream=stream, name=tag, purpose=CpRing(i, backward),
                      peer=peer, size_bytes=size, tag=tag, layer=op.layer,
                      microbatch=op.microbatch, phase=op.phase, dtype=self.ctx.model.dtype)

        send = Node(message(OpKind.SEND, Stream.CP_SEND, to), core.unit, after)
        recv = Node(message(OpKind.RECV, Stream.CP_RECV, source), core.unit)
        return send, recv

    # --- all-gather ----------------------------------------------------------------------

    def _gathered(self, core: Node) -> list[Node]:
        """All-gather K/V, the core over the whole sequence, and in backward the
        reduce-scatter of dK/dV."""
        op, cp, kv = core.op, self.cp, self.kv
        backward = op.phase is Phase.BWD
        others = (cp - 1) * kv  # the other ranks' K/V, read (and, backward, their dK/dV written)
        wide = dataclasses.replace(op, flops=op.flops * cp, draws=op.draws * cp,
                                   mem_bytes=op.mem_bytes + (2 if backward else 1) * others)
        out = [self._collective(op, OpKind.ALL_GATHER, CpGather(False), core),
               Node(wide, core.unit, core.after)]
        if backward:
            out.append(self._collective(op, OpKind.REDUCE_SCATTER, CpGather(True), core))
        return out

    def _collective(self, op: Op, kind: OpKind, purpose: CpGather, core: Node) -> Node:
        grads = kind is OpKind.REDUCE_SCATTER
        block = self.grad_kv if grads else self.kv
        dtype = "fp32" if grads and repeats_kv(self.ctx) else self.ctx.model.dtype
        return Node(Op(kind=kind, stream=Stream.COMPUTE, name="cp", purpose=purpose,
                       group=self.group, size_bytes=self.cp * block, layer=op.layer,
                       microbatch=op.microbatch, phase=op.phase, dtype=dtype),
                    core.unit)
