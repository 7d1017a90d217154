"""Context-parallel attention on one rank: the plan's ring steps, messages and gathers
(`traces.plan.context`), run for real on the attention core's own arithmetic.

The rank holds chunks r and 2·cp − 1 − r of the sequence (`local_positions`); its QKV slot
holds those tokens. Attention over the whole sequence is assembled block by block, a block
being the K/V of one CP rank: forward, each block's scores S = QKᵀ/√d under the causal mask
of the tokens' global positions, merged into the output by their log-sum-exp (flash
attention's online softmax); backward, from the saved output O and log-sum-exp L, per block
P = exp(S − L), dV = Pᵀ·dO, dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O)), dQ = dS·K/√d, dK = dSᵀ·Q/√d.
That is exactly softmax attention's gradient, so the result equals one process's attention
over the whole sequence up to rounding.

    p2p        forward step i attends to the block of CP rank r − i (its own first), which
               message i forwards to the next rank; backward runs the ring the other way,
               step i on the block of rank r + 1 + i (kept from the forward's last step,
               its own last), message m carrying that block's K/V and the dK/dV of the
               previous step's block accumulated so far (Transformer Engine's
               AttnFuncWithCPAndKVP2P)
    all_gather forward: K/V of every CP rank gathered, one block; backward: gathered again
               (only the rank's own K/V is kept), dK/dV of every rank reduce-scattered

Under torch's stacks (`kernels = "eager" | "compiled"`, standard attention) K and V travel at
the query heads and dK/dV in fp32, as the plan costs them (`traces.plan.context.repeats_kv`:
torchtitan repeats K/V before sdpa, PyTorch's context parallelism accumulates and sends dK/dV
in fp32); a backward message then carries both dtypes, packed as bytes. The QKV slot's
gradient is summed back to the K/V groups at the end.

Scores are fp32 tensors of b·(a/t)·(s/cp)² per block: this is for the CPU executor's small
models, not a fused kernel. Dropout inside attention is not applied (the executor refuses
cp > 1 with dropout).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from executor.attention import merge_heads, split_qkv
from executor.comm import Comm, Handle
from executor.groups import GroupKey
from executor.kernels import KernelContext, local_positions
from executor.tape import DROPPED_IN_RECOMPUTE, KEPT_FOR_RECOMPUTE, Tape, recomputed
from traces.layout import Axis, CpComm, Layout
from traces.ops import Phase, Stream
from traces.purpose import Kernel

Key = tuple[int, ...]
"""(micro-batch, layer) of a backward; (micro-batch, layer, pass) of a forward, pass 0 the
forward and 1 its recomputation (a late send of one must not read the other)."""


def local_tokens(rows: torch.Tensor, cp: int, cp_rank: int) -> torch.Tensor:
    """The [s/cp, b] part of [s, b] token ids (or targets) this CP rank holds."""
    return rows[local_positions(rows.shape[0], cp, cp_rank)].contiguous()


@dataclass(slots=True)
class _Forward:
    q: torch.Tensor
    own: torch.Tensor
    """This rank's K and V, [2, b, heads, s, d]."""
    out: torch.Tensor
    lse: torch.Tensor
    blocks: dict[int, torch.Tensor] = field(default_factory=dict)
    """all_gather: every rank's K/V (key -1)."""


@dataclass(slots=True)
class _Backward:
    q: torch.Tensor
    own: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    last: torch.Tensor | None
    """p2p: the block the forward ended on (rank r + 1's), backward step 0's."""
    dout: torch.Tensor | None = None
    delta: torch.Tensor | None = None
    dq: torch.Tensor | None = None
    blocks: dict[int, torch.Tensor] = field(default_factory=dict)
    """all_gather: every rank's K/V gathered again (key -1)."""
    mine: dict[int, torch.Tensor] = field(default_factory=dict)
    """This rank's dK/dV contribution at each step."""
    gathered: torch.Tensor | None = None
    """all_gather: every rank's dK/dV, to reduce-scatter."""
    delivered: bool = False
    last_sent: bool = False
    """p2p: the state lives until both its gradient went to the tape and its last message
    (which reads it) was sent."""


class CpAttention:
    """One rank's CP attention state across the plan's ops (module docstring)."""

    def __init__(self, layout: Layout, rank: int, seq_len: int, comm: Comm,
                 key: GroupKey, deliver: Callable[[Key, torch.Tensor], None], *,
                 block_shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device, groups: int, repeat: bool = False) -> None:
        self.cp, self.comm, self.key = layout.cp, comm, key
        self.deliver = deliver
        """Called with the QKV slot's gradient once a backward is complete."""
        self.group = key[1]
        self.me = self.group.index(rank)
        self.positions = [local_positions(seq_len, self.cp, i) for i in range(self.cp)]
        self.block_shape, self.dtype, self.device = block_shape, dtype, device
        """One block: K and V, [2, b, kv heads on this TP rank (query heads with `repeat`),
        s/cp, d]."""
        self.groups, self.repeat = groups, repeat
        """K/V heads of this TP rank in the QKV slot; whether blocks carry them repeated to the
        query heads (torch's stacks, module docstring)."""
        self.grad_dtype = torch.float32 if repeat else dtype
        """dK/dV's dtype in the ring and the reduce-scatter."""
        self.gather_key: GroupKey = (Stream.CP_RECV, key[1]) if repeat else key
        """all_gather mode's K/V gather: under torch's stacks on the cp_recv stream, beside the
        rank's own step, as the plan places it."""
        self.forwards: dict[Key, _Forward] = {}
        self.backwards: dict[Key, _Backward] = {}
        self.arrived: dict[tuple[Key, bool, int], torch.Tensor] = {}
        """What ring messages brought, by (key, backward, step)."""

    # --- block arithmetic ------------------------------------------------------------------

    def _scores(self, q: torch.Tensor, k: torch.Tensor, origin: int | None) -> torch.Tensor:
        """Masked scaled scores of this rank's queries on the keys of CP rank `origin`
        (None: every rank's, in group order)."""
        k = _expand(k, q.shape[1])
        kpos = torch.cat(self.positions) if origin is None else self.positions[origin]
        mask = kpos.unsqueeze(0) > self.positions[self.me].unsqueeze(1)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        return scores.masked_fill(mask.to(q.device), float("-inf"))

    def _attend(self, state: _Forward, block: torch.Tensor, origin: int | None) -> None:
        """Merge one block into the running output by log-sum-exp."""
        k, v = block[0], _expand(block[1], state.q.shape[1])
        scores = self._scores(state.q, k, origin)
        lse = torch.logaddexp(state.lse, torch.logsumexp(scores, dim=-1))
        probs = torch.exp(scores - lse.unsqueeze(-1))
        state.out = state.out * torch.exp(state.lse - lse).unsqueeze(-1) + probs @ v
        state.lse = lse

    def _grads(self, state: _Backward, block: torch.Tensor, origin: int | None
               ) -> torch.Tensor:
        """dQ added into the state; returns this block's dK/dV, [2, b, heads, s, d]."""
        heads, groups = state.q.shape[1], block.shape[2]
        k, v = _expand(block[0], heads), _expand(block[1], heads)
        assert state.dout is not None and state.delta is not None and state.dq is not None
        scale = 1.0 / math.sqrt(state.q.shape[-1])
        probs = torch.exp(self._scores(state.q, block[0], origin) - state.lse.unsqueeze(-1))
        dv = probs.transpose(-2, -1) @ state.dout
        ds = probs * (state.dout @ v.transpose(-2, -1) - state.delta.unsqueeze(-1))
        state.dq = state.dq + (ds @ k) * scale
        dk = (ds.transpose(-2, -1) @ state.q) * scale
        return torch.stack([_fold(dk, groups), _fold(dv, groups)]).to(self.grad_dtype)

    # --- the plan's calls --------------------------------------------------------------------

    def begin_forward(self, key: Key, qkv: torch.Tensor, ctx: KernelContext) -> _Forward:
        q, k, v = split_qkv(qkv, ctx.heads, ctx.kv_heads or ctx.heads)
        if self.repeat:
            k, v = _expand(k, ctx.heads), _expand(v, ctx.heads)
        state = _Forward(q=q, own=torch.stack([k, v]).contiguous(),
                         out=torch.zeros_like(q),
                         lse=torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype,
                                        device=q.device))
        self.forwards[key] = state
        return state

    def forward_step(self, key: Key, step: int, qkv: torch.Tensor | None,
                     ctx: KernelContext, gathered: bool) -> torch.Tensor | None:
        """Attend to step `step`'s block (p2p) or to every block (all_gather); the context
        slot's value [s, b, heads·d] after the last step, else None."""
        if step == 0 and not gathered and key not in self.forwards:  # the send may have begun it
            assert qkv is not None
            self.begin_forward(key, qkv, ctx)
        state = self.forwards[key]
        if gathered:
            self._attend(state, state.blocks.pop(-1), None)
            return merge_heads(state.out)
        self._attend(state, self._forward_block(key, step), (self.me - step) % self.cp)
        return merge_heads(state.out) if step == self.cp - 1 else None

    def _forward_block(self, key: Key, step: int) -> torch.Tensor:
        """The block forward step `step` attends to: this rank's, then what came in."""
        return self.forwards[key].own if step == 0 else self.arrived[(key, False, step - 1)]

    def end_forward(self, key: Key, keep: bool) -> None:
        """The forward is over: keep what the backward needs (or nothing, when a recompute
        will run it again)."""
        state = self.forwards[key]  # kept: a send of the ring may still be to come
        if keep:
            last = self.arrived.get((key, False, self.cp - 2))
            self.backwards[key[:2]] = _Backward(q=state.q, own=state.own, out=state.out,
                                                lse=state.lse, last=last)

    def message(self, key: Key, step: int, backward: bool, send: bool, peer: int,
                tag: str) -> Handle:
        """Send or receive ring message `step`. A receive is posted ahead of everything
        (its op waits for nothing): what it brings waits in `arrived` until it is used."""
        if send:
            if not backward:
                return self.comm.send(self._forward_block(key, step), peer, tag)
            handle = self.comm.send(self._backward_payload(key, step), peer, tag)
            if step == self.cp - 1:
                self.backwards[key].last_sent = True
                self._forget_if_done(key)
            return handle
        buf = self._backward_buffer(step) if backward else \
            torch.empty(self.block_shape, dtype=self.dtype, device=self.device)

        def arrived() -> None:
            self.arrived[(key, backward, step)] = buf
            if backward:
                self._deliver_if_done(key)
        return self.comm.recv(buf, peer, tag, then=arrived)

    def _parts(self, step: int) -> tuple[torch.dtype, ...]:
        """The parts of backward message `step`, by dtype: K/V but at the last, dK/dV but at
        the first."""
        kv = (self.dtype,) if step < self.cp - 1 else ()
        return kv + ((self.grad_dtype,) if step >= 1 else ())

    def _packed(self, step: int) -> bool:
        """Whether backward message `step` carries two dtypes, sent as bytes."""
        return len(set(self._parts(step))) > 1

    def _backward_buffer(self, step: int) -> torch.Tensor:
        parts = self._parts(step)
        if self._packed(step):
            block = math.prod(self.block_shape)
            size = sum(block * d.itemsize for d in parts)
            return torch.empty(size, dtype=torch.uint8, device=self.device)
        rows = 2 * len(parts)
        return torch.empty((rows, *self.block_shape[1:]), dtype=parts[0], device=self.device)

    def _backward_payload(self, key: Key, step: int) -> torch.Tensor:
        payload = []
        if step < self.cp - 1:
            payload.append(self._backward_block(key, step))
        if step >= 1:
            payload.append(self._accumulated(key, step - 1))
        if self._packed(step):
            return torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in payload])
        return torch.cat(payload).contiguous()

    def _unpacked(self, key: Key, step: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """What backward message `step` brought: (its K/V block, its dK/dV), None where it
        carries none."""
        buf = self.arrived[(key, True, step)]
        if not self._packed(step):
            kv = buf[:2] if step < self.cp - 1 else None
            grads = (buf[2:] if kv is not None else buf) if step >= 1 else None
            return kv, grads
        split = math.prod(self.block_shape) * self.dtype.itemsize
        return (buf[:split].view(self.dtype).view(self.block_shape),
                buf[split:].view(self.grad_dtype).view(self.block_shape))

    def _backward_block(self, key: Key, step: int) -> torch.Tensor:
        """The block backward step `step` works on: the forward's last (rank r + 1's), then
        what came in."""
        if step == 0:
            bwd = self.backwards[key]
            return bwd.last if bwd.last is not None else bwd.own
        kv, _ = self._unpacked(key, step - 1)
        assert kv is not None, "a backward message before the last carries K/V"
        return kv

    def _partial(self, key: Key, step: int) -> torch.Tensor | None:
        """The dK/dV message `step` brought for the block of backward step `step`."""
        if step == 0 or (key, True, step) not in self.arrived:
            return None
        return self._unpacked(key, step)[1]

    def _accumulated(self, key: Key, step: int) -> torch.Tensor:
        mine = self.backwards[key].mine[step]
        partial = self._partial(key, step)
        return mine if partial is None else mine + partial

    def _deliver_if_done(self, key: Key) -> None:
        """p2p: once the last step ran and the last message (this rank's dK/dV from the
        others) is in, the QKV slot's gradient goes to the tape."""
        bwd = self.backwards.get(key)
        last = self.cp - 1
        if bwd is not None and not bwd.delivered and last in bwd.mine and \
                self._partial(key, last) is not None:
            self.deliver(key, self.take_grads(key))
            bwd.delivered = True
            self._forget_if_done(key)

    def _forget_if_done(self, key: Key) -> None:
        """Drop a finished backward's state and what the ring brought for it."""
        bwd = self.backwards[key]
        if bwd.delivered and bwd.last_sent:
            self._forget(key)

    def _forget(self, key: Key) -> None:
        self.backwards.pop(key, None)
        for fkey in [k for k in self.forwards if k[:2] == key]:
            del self.forwards[fkey]
        for arrival in [a for a in self.arrived if a[0][:2] == key]:
            del self.arrived[arrival]

    def backward_step(self, key: Key, step: int, dctx: torch.Tensor | None,
                      ctx: KernelContext, gathered: bool) -> None:
        """One step's dQ and dK/dV (p2p), or all of them (all_gather)."""
        bwd = self.backwards[key]
        if step == 0:
            assert dctx is not None
            bwd.dout = heads_of_context(dctx, ctx.heads)
            bwd.delta = (bwd.dout * bwd.out).sum(dim=-1)
            bwd.dq = torch.zeros_like(bwd.q)
        if gathered:
            bwd.gathered = self._grads(bwd, bwd.blocks.pop(-1), None)
            return
        bwd.mine[step] = self._grads(bwd, self._backward_block(key, step),
                                     (self.me + 1 + step) % self.cp)
        self._deliver_if_done(key)

    def take_grads(self, key: Key) -> torch.Tensor:
        """The QKV slot's gradient [s, b, 3·heads·d] once the backward is complete."""
        bwd = self.backwards[key]
        dkv = bwd.gathered if bwd.gathered is not None else self._accumulated(key, self.cp - 1)
        assert bwd.dq is not None
        dk, dv = (_fold(g, self.groups).to(self.dtype) for g in dkv)
        return qkv_of(bwd.dq, dk, dv)

    # --- all_gather mode -----------------------------------------------------------------

    def gather(self, key: Key, backward: bool, qkv: torch.Tensor | None,
               ctx: KernelContext) -> None:
        """`key`: the backward's, or the forward pass's."""
        """All-gather every CP rank's K/V (forward: from the QKV slot; backward: from the
        K/V the forward kept)."""
        if backward:
            own = self.backwards[key].own
            store = self.backwards[key].blocks
        else:
            assert qkv is not None
            state = self.begin_forward(key, qkv, ctx)
            own, store = state.own, state.blocks
        out = torch.empty((self.cp * own.shape[0], *own.shape[1:]), dtype=own.dtype,
                          device=own.device)  # the members' blocks one after another
        self.comm.all_gather(out, own, self.gather_key)
        store[-1] = torch.cat(list(out.view(self.cp, *own.shape)), dim=-2)  # keys in order

    def reduce_scatter(self, key: Key) -> None:
        """Sum every rank's dK/dV for this rank's block."""
        bwd = self.backwards[key]
        assert bwd.gathered is not None
        blocks = torch.cat(bwd.gathered.chunk(self.cp, dim=-2)).contiguous()  # by member
        mine = torch.empty_like(bwd.own, dtype=self.grad_dtype)
        self.comm.reduce_scatter(mine, blocks, self.key)
        bwd.gathered = mine
        self.deliver(key, self.take_grads(key))
        self._forget(key)


def _expand(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V [b, groups, s, d] repeated to `heads` query heads (grouped-query attention;
    the tensor itself when every query head has its own)."""
    groups = kv.shape[1]
    return kv if groups == heads else kv.repeat_interleave(heads // groups, dim=1)


def _fold(grad: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient [b, heads, s, d] of an `_expand`ed K or V, summed back to its groups."""
    b, heads, s, d = grad.shape
    if groups == heads:
        return grad
    return grad.view(b, groups, heads // groups, s, d).sum(dim=2)


def heads_of_context(ctx: torch.Tensor, heads: int) -> torch.Tensor:
    """[s, b, heads·d] -> [b, heads, s, d]."""
    s, b, width = ctx.shape
    return ctx.view(s, b, heads, width // heads).permute(1, 2, 0, 3)


def qkv_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [b, heads, s, d], k and v [b, groups, s, d] -> the QKV slot (`split_qkv` inverted)."""
    s, b = q.shape[2], q.shape[0]
    return torch.cat([t.permute(2, 0, 1, 3).reshape(s, b, -1) for t in (q, k, v)], -1).contiguous()


class CpRank:
    """The runtime's CP operations over its tapes: `RankRuntime.cp_attend`, `cp_message` and
    `cp_exchange` delegate here (one per rank, with cp > 1)."""

    def __init__(self, layout: Layout, rank: int, comm: Comm, tapes: dict[int, Tape], *,
                 block_shape: tuple[int, ...], seq_len: int, dtype: torch.dtype,
                 device: torch.device, groups: int, repeat: bool = False) -> None:
        self.layout, self.tapes = layout, tapes
        group = layout.group(rank, Axis.CP)
        self.attention = CpAttention(layout, rank, seq_len, comm, (Stream.COMPUTE, group),
                                     self._deliver, block_shape=block_shape, dtype=dtype,
                                     device=device, groups=groups, repeat=repeat)
        self.gathered = layout.cp_comm is CpComm.ALL_GATHER

    def _deliver(self, key: Key, grad: torch.Tensor) -> None:
        mb, layer = key
        self.tapes[mb].put_grad((layer, "qkv"), grad)

    def attend(self, tape: Tape, phase: Phase, layer: int, mb: int, step: int,
               ctx: KernelContext) -> None:
        key, attention = _key(mb, layer, phase), self.attention
        if self.gathered and step > 0:  # under torch's stacks the plan times the gathered core
            return  # as the rank's own block, then the rest (`traces.plan.context`): step 0 ran all
        if phase is Phase.BWD:
            dctx = tape.take_grad((layer, "ctx")) if step == 0 else None
            attention.backward_step(key, step, dctx, ctx, self.gathered)
            return
        first = step == 0 and not self.gathered
        out = attention.forward_step(key, step, tape.acts[(layer, "qkv")] if first else None,
                                     ctx, self.gathered)
        if out is None:
            return
        recompute, recomputing = self.layout.recompute, phase is Phase.RECOMPUTE
        attention.end_forward(key, recomputing or not recomputed(Kernel.FLASH_ATTN, recompute))
        # the flash kernel's slots, as executor.tape keeps them (its output, its input)
        if not (recomputing and "ctx" in DROPPED_IN_RECOMPUTE[recompute]):
            tape.put((layer, "ctx"), out)
        if recomputing or "qkv" not in KEPT_FOR_RECOMPUTE[recompute]:
            tape.release((layer, "qkv"))

    def message(self, tape: Tape, phase: Phase, send: bool, step: int, backward: bool,
                layer: int, mb: int, peer: int, tag: str, ctx: KernelContext) -> Handle:
        key = _key(mb, layer, phase)
        if send and not backward and step == 0 and key not in self.attention.forwards:
            # the ring's first send waits only for the QKV GEMM: it starts the pass
            self.attention.begin_forward(key, tape.acts[(layer, "qkv")], ctx)
        return self.attention.message(key, step, backward, send, peer, tag)

    def exchange(self, tape: Tape, grad: bool, phase: Phase, layer: int, mb: int,
                 ctx: KernelContext) -> None:
        key = _key(mb, layer, phase)
        if grad:
            self.attention.reduce_scatter(key)
            return
        backward = phase is Phase.BWD
        self.attention.gather(key, backward, None if backward else tape.acts[(layer, "qkv")],
                              ctx)


def _key(mb: int, layer: int, phase: Phase) -> Key:
    """A backward's key, or a forward pass's (module docstring of `Key`)."""
    if phase is Phase.BWD:
        return (mb, layer)
    return (mb, layer, int(phase is Phase.RECOMPUTE))
