"""An MoE layer's kernels (`traces.moe`) as torch functions, and its EP all-to-alls.

In place of the dense fc1, activation and fc2 (Megatron-Core's MoELayer with the all-to-all
token dispatcher), on the rank's T tokens (its sequence shard under SP), with the routing of
`executor.routing`:

    router      a2 -> logits [s, b, E]          router.weight, replicated
    topk        logits -> gates [T, k] (softmax over the chosen experts, or their normalised
                sigmoids), scores [T, E] (over all, no gradient: the load-balancing loss
                reads them)
    aux_loss    scores -> (nothing): Switch's E·Σ_e f_e·P_e, coefficient 0 (no gradient)
    permute     a2 -> perm [A, h]: the kept assignments' token rows, in (expert, token) order
    [dispatch]  perm -> recv [EP·L, h]: per source EP rank, its rows for this rank's experts
    expert_fc1  recv -> eh1 [R, f1], R = EP·L rows regrouped expert by expert
    expert_act  eh1 -> eh2 [R, f] (SwiGLU or GeLU, as the dense MLP)
    expert_fc2  eh2 -> eout [EP·L, h], back in source order
    [combine]   eout -> back [A, h]
    unpermute   (back, gates) -> mlp [s, b, h]: each token's kept rows times their gates, summed

The bracketed exchanges are `MoeExchange.all_to_all` (the plan's `ExpertAllToAll` ops), an
`all_to_all_single` over the EP group with uneven splits: rank i sends rank j the rows of j's
experts (`Routing.per_rank`), receives L = Σ counts of its own experts from every source; the
gradients go the opposite way in backward. With EP 1 there are no exchanges: permute writes
`recv` and expert_fc2 `back` directly. The plan's grouped GEMMs are one op per distinct token
count; the first runs every local expert (one autograd call), the others nothing
(`executor.program`). With `dispatch = "deepep"` or `"hybridep"` each exchange runs as two
hops, once per destination node then forwarded inside it (`executor.hops`), logged as the
plan's one all-to-all.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from executor.comm import Comm, Handle
from executor.deepep import NodeMap, combine_hops, dispatch_hops
from executor.hops import HopPlan
from executor.kernels import KernelContext, TorchKernel
from executor.routing import Routing, aux_scores, expert_major, gates, route
from executor.tape import Tape
from traces.expert_grid import ep_coord, ep_group
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe import rank_tokens
from traces.ops import Stream
from traces.purpose import Kernel, MoeStep


def moe_kernels(model: ModelSpec, layout: Layout, rank: int) -> dict[Kernel, TorchKernel]:
    """The MoE kernels of `model` on `rank` (module docstring)."""
    ep, ep_rank, batch = layout.ep, ep_coord(layout, rank), layout.micro_batch
    tokens = routed_tokens(model, layout)

    def routing(ctx: KernelContext, rows: int = tokens) -> Routing:
        assert rows == tokens, f"an MoE kernel on {rows} tokens, not the rank's {tokens}"
        return route(model, ctx.layer, tokens)

    def topk(ctx: KernelContext, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = logits.reshape(-1, model.experts)
        score = model.moe_router_score_function
        return gates(flat, routing(ctx, flat.shape[0]), score), aux_scores(flat, score)

    def aux_loss(ctx: KernelContext, scores: torch.Tensor) -> tuple[()]:
        """The kernel's work, its value unused: the coefficient is 0 (executor.routing)."""
        with torch.no_grad():
            r = routing(ctx, scores.shape[0])
            share = torch.tensor(r.counts, dtype=torch.float32) / max(1, sum(r.counts))
            (share.to(scores.device) * scores.mean(dim=0)).sum().mul(model.experts)
        return ()

    def permute(ctx: KernelContext, a2: torch.Tensor) -> tuple[torch.Tensor]:
        x = a2.reshape(-1, model.hidden)
        return (x[routing(ctx, x.shape[0]).tokens.to(x.device)],)

    def grouped(rows: torch.Tensor, w: torch.Tensor, r: Routing) -> list[torch.Tensor]:
        sizes = [ep * c for c in r.local(ep, ep_rank)]
        return [x @ w[j].t() for j, x in enumerate(rows.split(sizes))]

    def expert_fc1(ctx: KernelContext, recv: torch.Tensor, w: torch.Tensor
                   ) -> tuple[torch.Tensor]:
        order, _ = expert_major(model, ctx.layer, tokens, ep, ep_rank)
        return (torch.cat(grouped(recv[order.to(recv.device)], w, routing(ctx))),)

    def expert_fc2(ctx: KernelContext, h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        _, back = expert_major(model, ctx.layer, tokens, ep, ep_rank)
        return (torch.cat(grouped(h, w, routing(ctx)))[back.to(h.device)],)

    def unpermute(ctx: KernelContext, back: torch.Tensor, g: torch.Tensor
                  ) -> tuple[torch.Tensor]:
        r = routing(ctx, g.shape[0])
        weights = g.reshape(-1)[r.choice.to(g.device)].to(back.dtype)
        out = back.new_zeros((g.shape[0], model.hidden))
        out = out.index_add(0, r.tokens.to(back.device), back * weights.unsqueeze(-1))
        return (out.view(-1, batch, model.hidden),)

    def act(ctx: KernelContext, x: torch.Tensor) -> tuple[torch.Tensor]:
        if model.ffn == "swiglu":
            gate, up = x.chunk(2, dim=-1)
            return (F.silu(gate) * up,)
        return (F.gelu(x),)

    received = "recv" if ep > 1 else "perm"
    returned = "eout" if ep > 1 else "back"
    table: list[tuple[str, str, str, str, Callable[..., tuple[torch.Tensor, ...]]]] = [
        ("router", "a2", "logits", "router.weight", _linear),
        ("topk", "logits", "gates scores", "", topk),
        ("aux_loss", "scores", "", "", aux_loss),
        ("permute", "a2", "perm", "", permute),
        ("expert_fc1", received, "eh1", "experts.fc1.weight", expert_fc1),
        ("expert_act", "eh1", "eh2", "", act),
        ("expert_fc2", "eh2", returned, "experts.fc2.weight", expert_fc2),
        ("unpermute", "back gates", "mlp", "", unpermute),
    ]
    return {Kernel(name): TorchKernel(Kernel(name), tuple(i.split()), tuple(o.split()),
                                      tuple(p.split()), fn, "layer")
            for name, i, o, p, fn in table}


def _linear(ctx: KernelContext, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
    return (F.linear(x, w),)


def routed_tokens(model: ModelSpec, layout: Layout) -> int:
    """T: the tokens one rank routes per micro-batch, b·s/(cp·t) (the plan's
    `traces.moe.rank_tokens` of its CP rank's s/cp)."""
    return rank_tokens(model, layout.micro_batch, layout.tp) // layout.cp


class MoeExchange:
    """One rank's dispatch and combine all-to-alls (module docstring)."""

    def __init__(self, model: ModelSpec, layout: Layout, rank: int, comm: Comm,
                 gpus_per_node: int = 8) -> None:
        self.model, self.comm, self.ep = model, comm, layout.ep
        self.ep_rank = ep_coord(layout, rank)
        self.key = (str(Stream.COMPUTE), ep_group(layout, rank))
        self.tokens = routed_tokens(model, layout)
        self.nodes = NodeMap([g // gpus_per_node for g in self.key[1]])
        self._hops: dict[tuple[int, bool], HopPlan] = {}

    def gather_routing(self, layer: int) -> None:
        """HybridEP's routing-map all-gather before a forward dispatch (the plan's
        `RoutingMapGather`): the rank's T x E map, one byte per token and expert, gathered
        over the EP group; every member routes alike here (`executor.routing.route`), so the
        gathered map is the rank's own, EP times, which is checked."""
        r = route(self.model, layer, self.tokens)
        mine = torch.zeros(self.tokens, self.model.experts, dtype=torch.uint8)
        rows = torch.arange(self.tokens).unsqueeze(1).expand_as(r.experts)
        mine[rows[r.kept], r.experts[r.kept]] = 1
        out = mine.new_empty((self.ep * self.tokens, self.model.experts))
        self.comm.all_gather(out, mine, self.key)
        if not torch.equal(out, mine.repeat(self.ep, 1)):
            raise RuntimeError(f"layer {layer}: the gathered routing maps differ from the "
                               "rank's own")

    def all_to_all(self, tape: Tape, step: MoeStep, grad: bool, layer: int,
                   stream: str = Stream.COMPUTE) -> Handle:
        """The exchange, its result put on the tape when it completes: at once on the compute
        stream; asynchronously on another (overlap_moe_comm's `ep_comm`: gloo's
        async_op, waited for before the op that reads it)."""
        r = route(self.model, layer, self.tokens)
        sent = list(r.per_rank(self.ep))
        got = [sum(r.local(self.ep, self.ep_rank))] * self.ep
        src, dst = {MoeStep.DISPATCH: ("perm", "recv"), MoeStep.COMBINE: ("eout", "back")}[step]
        forward = step is MoeStep.DISPATCH  # the direction tokens travel in the forward
        out_rows, in_splits = (got, sent) if forward != grad else (sent, got)
        if grad:
            src, dst = dst, src
            value = tape.take_grad((layer, src)).contiguous()
        else:
            value = tape.take((layer, src)).contiguous()
        if self.model.dispatch != "nccl":  # DeepEP / HybridEP: two hops (executor.hops)
            hops = self._hops.get((layer, forward))
            if hops is None:
                build = dispatch_hops if forward else combine_hops
                hops = self._hops[layer, forward] = build(r, self.nodes, self.ep_rank)
            exchange = self.comm.hop_exchange(
                (str(stream), self.key[1]), value.numel() * value.element_size(),
                tuple(n * value.shape[-1] * value.element_size() for n in in_splits))
            out = hops.backward(value, exchange) if grad else hops.forward(value, exchange)
            handle = Handle(None)
            handle.wait()
            (tape.put_grad if grad else tape.put)((layer, dst), out)
            return handle
        out = value.new_empty((sum(out_rows), value.shape[-1]))

        def put() -> None:
            if grad:
                tape.put_grad((layer, dst), out)
            else:
                tape.put((layer, dst), out)

        background = stream != Stream.COMPUTE
        handle = self.comm.all_to_all(out, value, (str(stream), self.key[1]),
                                      input_splits=in_splits, output_splits=out_rows,
                                      async_op=background, then=put)
        if not background:
            handle.wait()
        return handle
