"""MoE routing in the executor: which experts each token visits, exactly the plan's counts.

The plan's routing is an expectation (`traces.moe_spec.expert_counts`): expert e gets n_e of a
rank's T tokens, Σ n_e = T·k, n_e <= T, then at most the capacity c = ⌈f·T·k/E⌉ of them
(Megatron-Core's moe_utils.get_capacity). To run it for real, `route` assigns tokens so those
counts hold exactly, deterministically (no sample; the same on every rank and in the
single-process reference):

    assignment  T·k slots in a row, expert e owns n_e consecutive ones (experts in order);
                slot p goes to token p mod T as its choice p div T. Since n_e <= T, no token
                meets an expert twice: k distinct experts per token
    capacity    an expert keeps its first c tokens by token index (Megatron-Core's "position"
                drop policy); the others' assignments are dropped (no expert work, no output)
    gates       softmax over the token's k chosen experts' router logits (Mixtral's and
                Megatron-Core's default top-k-then-softmax), so the router learns through
                the gates; a dropped choice keeps its share of the softmax and adds nothing.
                With `moe_router_score_function = "sigmoid"`: the chosen logits' sigmoids
                normalised to sum 1 (DeepSeek-V3 §2.1.2)
    bias        `moe_router_enable_expert_bias` (aux-loss-free balancing) adds a bias to the
                scores that pick, never to the gates; the counts pick here, so the run is
                the one without it (the plan costs the bias's kernels)
    order       kept assignments sorted by (expert, token): the permuted rows, and since
                experts lie in EP order, one contiguous block per destination EP rank

The router logits choose nothing here (the counts do), so the load-balancing loss would only
shape routing the run does not take: the executor computes it with coefficient 0, Megatron-LM's
default --moe-aux-loss-coeff, and it adds no gradient.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from traces.model import ModelSpec
from traces.moe_spec import expert_counts


@dataclass(frozen=True, slots=True)
class Routing:
    """One rank's routing of T tokens in one MoE layer."""

    experts: torch.Tensor
    """[T, k] int64: each token's chosen experts."""
    kept: torch.Tensor
    """[T, k] bool: the choice survived the capacity."""
    counts: tuple[int, ...]
    """Kept tokens per expert (`traces.moe_spec.expert_counts`)."""
    tokens: torch.Tensor
    """[A] int64: the token of each kept assignment, in (expert, token) order."""
    choice: torch.Tensor
    """[A] int64: index t·k + j of each kept assignment in the [T, k] gates, same order."""

    def per_rank(self, ep: int) -> tuple[int, ...]:
        """Kept assignments sent to each EP rank (experts E/ep per rank, in order)."""
        n = len(self.counts) // ep
        return tuple(sum(self.counts[d * n:(d + 1) * n]) for d in range(ep))

    def local(self, ep: int, ep_rank: int) -> tuple[int, ...]:
        """Kept tokens of each of EP rank `ep_rank`'s experts from one source rank."""
        n = len(self.counts) // ep
        return self.counts[ep_rank * n:(ep_rank + 1) * n]


def route(model: ModelSpec, layer: int, tokens: int) -> Routing:
    """The routing of `tokens` tokens of one rank in MoE layer `layer` (module docstring)."""
    return _route(model, layer, tokens)


@lru_cache(maxsize=256)
def _route(model: ModelSpec, layer: int, tokens: int) -> Routing:
    experts, k, capacity_factor = model.experts, model.top_k, model.capacity_factor
    dropless = dataclasses.replace(model, capacity_factor=0)
    routed = expert_counts(dropless, layer, tokens)
    cap = math.ceil(capacity_factor * tokens * k / experts) if capacity_factor else tokens
    chosen = torch.empty(tokens * k, dtype=torch.long)
    offset = 0
    for e, n in enumerate(routed):  # slots in [offset, offset + n) are expert e's
        assert n <= tokens, "top-k picks distinct experts: no expert gets more than T"
        chosen[offset:offset + n] = e
        offset += n
    experts_tk = chosen.view(k, tokens).t().contiguous()  # slot j·T + t -> [t, j]
    kept = torch.zeros(tokens, k, dtype=torch.bool)
    pairs_tokens, pairs_choice, counts = [], [], []
    for e in range(experts):
        t, j = (experts_tk == e).nonzero(as_tuple=True)  # row-major: tokens ascending
        t, j = t[:cap], j[:cap]
        kept[t, j] = True
        pairs_tokens.append(t)
        pairs_choice.append(t * k + j)
        counts.append(len(t))
    assert tuple(counts) == expert_counts(model, layer, tokens), "the plan's kept counts"
    return Routing(experts_tk, kept, tuple(counts), torch.cat(pairs_tokens),
                   torch.cat(pairs_choice))


def gates(logits: torch.Tensor, routing: Routing, score: str = "softmax") -> torch.Tensor:
    """[T, k]: each token's weights of its chosen experts ([T, E] logits in): softmax over the
    chosen logits, or (score "sigmoid", DeepSeek-V3 §2.1.2 eq. 13) their sigmoids normalised
    to sum 1, with Megatron-Core's 1e-20 in the denominator (moe_utils's
    topk_routing_with_score_function). An expert bias never enters them: it only picks."""
    chosen = logits.gather(1, routing.experts.to(logits.device))
    if score == "sigmoid":
        s = torch.sigmoid(chosen)
        return s / (s.sum(dim=-1, keepdim=True) + 1e-20)
    return torch.softmax(chosen, dim=-1)


def aux_scores(logits: torch.Tensor, score: str = "softmax") -> torch.Tensor:
    """[T, E], no gradient: the scores the load-balancing loss reads: softmax over all
    experts, or sigmoids normalised over all experts (Megatron-Core's
    compute_routing_scores_for_aux_loss)."""
    with torch.no_grad():
        if score == "sigmoid":
            s = torch.sigmoid(logits.float())
            return s / (s.sum(dim=-1, keepdim=True) + 1e-20)
        return torch.softmax(logits.float(), dim=-1)


def expert_major(model: ModelSpec, layer: int, tokens: int, ep: int, ep_rank: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the received block (source-major: per source EP rank, its rows for this rank's
    experts in expert order) rearranged expert-major: per local expert, every source's rows;
    and the inverse permutation."""
    return _expert_major(model, layer, tokens, ep, ep_rank)


@lru_cache(maxsize=256)
def _expert_major(model: ModelSpec, layer: int, tokens: int, ep: int, ep_rank: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    local = route(model, layer, tokens).local(ep, ep_rank)
    per_source = sum(local)
    starts = [sum(local[:j]) for j in range(len(local))]
    index = torch.tensor([s * per_source + starts[j] + i for j, n in enumerate(local)
                          for s in range(ep) for i in range(n)], dtype=torch.long)
    return index, torch.argsort(index)
