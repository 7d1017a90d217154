"""DeepEP-style dispatch: each token crosses InfiniBand once per destination node, then NVLink.

DeepEP's internode kernels (github.com/deepseek-ai/DeepEP, README: "normal kernels ...
asymmetric-domain bandwidth forwarding, such as forwarding data from NVLink domain to RDMA
domain"; used with DeepSeek-V3's node-limited routing) send a token's hidden state by RDMA once
to each node that holds one of its experts, to the GPU of the same local index, which forwards
it over NVLink to each GPU of its node holding one of the token's experts; a GPU gets a token
once, however many of its experts the token chose. NCCL's all-to-all (Megatron-Core's
MoEAlltoAllTokenDispatcher) sends one row per (token, expert) pair instead.

One source rank's bytes per link class, member j of the EP group holding experts
[j·E/EP, (j+1)·E/EP), row = h·e bytes, c_D the rank's routed pairs to experts D:

    nccl     to j on its node: c_j·row over NVLink; on another node: c_j·row over InfiniBand
    deepep   to node N ≠ its own: tokens(N)·row over InfiniBand to the relay (the member of N
             at its own position); relay -> j ≠ relay on N, and source -> j on its own node:
             tokens(j)·row over NVLink

tokens(D) is `traces.moe_groups.distinct_tokens`. The combine returns the same bytes the other
way, which is what DeepEP's combine moves (README, internode combine; deep_ep/buffer.py
`internode_combine`): each GPU has already summed its own experts' rows of a token (the
unpermute), sends that one row over NVLink to the relay, which sums the node's rows and sends
one row per token back over InfiniBand: tokens(j) over NVLink, tokens(N) over InfiniBand, not
NCCL's c_j rows (the executor's combine, which applies the gates at the source, moves
per-pair rows instead: `executor.hops`).
`DeepEp` is what a dispatch op carries (`traces.alltoallv.deepep_split`) for the simulator
to lower these flows once it knows the nodes (`sim.collectives.deepep`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from traces.moe_groups import distinct_tokens

Flow = tuple[int, int, float]
"""(sender, receiver, bytes): global ranks."""


@dataclass(frozen=True, slots=True)
class DeepEp:
    """One rank's routing of one layer: its routed pairs per expert (`counts`) of `tokens`
    tokens, rows of `row` bytes, and the router's shape (`traces.moe_groups`)."""

    experts: int
    top_k: int
    router_groups: int
    router_group_topk: int
    tokens: int
    row: float
    counts: tuple[int, ...]
    force_balance: bool = False
    dispatch: str = "deepep"
    """Whose kernels move it: DeepEP's, or HybridEP's ("hybridep": the same flows,
    `traces.hybridep`; their measured pace, `sim.collectives.hybridep_rate`)."""

    def routed(self, member: int, ep: int) -> tuple[range, int]:
        """EP member `member`'s experts and the pairs routed to them."""
        per = self.experts // ep
        experts = range(member * per, (member + 1) * per)
        return experts, sum(self.counts[x] for x in experts)

    def tokens_to(self, members: Sequence[int], ep: int) -> float:
        """Distinct tokens reaching any expert of these EP members."""
        experts = [x for j in members for x in self.routed(j, ep)[0]]
        pairs = sum(self.routed(j, ep)[1] for j in members)
        return distinct_tokens(self, experts, pairs, self.tokens)


def to_json(d: DeepEp) -> dict[str, Any]:
    """The file's object; "dispatch" only for HybridEP (DeepEP's files stay as they were)."""
    out = {"experts": d.experts, "top_k": d.top_k, "router_groups": d.router_groups,
           "router_group_topk": d.router_group_topk, "tokens": d.tokens, "row": d.row,
           "counts": list(d.counts)}
    return out if d.dispatch == "deepep" else {**out, "dispatch": d.dispatch}


def from_json(value: object) -> DeepEp:
    """A file's DeepEp, or ValueError with the rule."""
    keys = {"experts", "top_k", "router_groups", "router_group_topk", "tokens", "row", "counts"}
    if type(value) is not dict or set(value) - {"dispatch"} != keys:
        raise ValueError(f"'deepep' must be an object with exactly {', '.join(sorted(keys))} "
                         "(and optionally \"dispatch\")")
    dispatch = value.get("dispatch", "deepep")
    if dispatch not in ("deepep", "hybridep"):
        raise ValueError("'deepep' dispatch must be \"deepep\" or \"hybridep\"")
    counts = value["counts"]
    ints = [value[k] for k in keys - {"row", "counts"}]
    if not all(type(x) is int and x >= 0 for x in [*ints, *counts]) or \
            type(value["row"]) not in (int, float) or len(counts) != value["experts"]:
        raise ValueError("'deepep' needs whole counts >= 0, one per expert, and a row size")
    return DeepEp(value["experts"], value["top_k"], value["router_groups"],
                  value["router_group_topk"], value["tokens"], float(value["row"]),
                  tuple(counts), dispatch=dispatch)


def _nodes(group: Sequence[int], node_of: Sequence[int]) -> dict[int, list[int]]:
    """Members (positions in the group) per node, in group order."""
    out: dict[int, list[int]] = {}
    for j in range(len(group)):
        out.setdefault(node_of[j], []).append(j)
    return out


def nccl_flows(d: DeepEp, group: Sequence[int], node_of: Sequence[int]) -> list[Flow]:
    """Every member's dispatch rows, one per (token, expert) pair, to every other member."""
    ep = len(group)
    return [(group[i], group[j], d.routed(j, ep)[1] * d.row)
            for i in range(ep) for j in range(ep) if i != j and d.routed(j, ep)[1]]


def deepep_flows(d: DeepEp, group: Sequence[int], node_of: Sequence[int]) -> list[Flow]:
    """Every member's dispatch as DeepEP moves it (module docstring): InfiniBand flows to each
    other node's relay, NVLink flows from the relay (or, on its own node, the source). Worked
    out once per routing and placement shape (`_member_flows`) for all the group's copies."""
    return [(group[i], group[j], size) for i, j, size in _member_flows(d, _shape(node_of))]


def _shape(node_of: Sequence[int]) -> tuple[int, ...]:
    """Node ids renamed in order of first appearance: groups placed alike share one shape."""
    names: dict[int, int] = {}
    return tuple(names.setdefault(n, len(names)) for n in node_of)


@lru_cache(maxsize=64)
def _member_flows(d: DeepEp, node_of: tuple[int, ...]) -> tuple[tuple[int, int, float], ...]:
    """`deepep_flows` between positions in the group: each member's tokens to a set of
    members counted once (`DeepEp.tokens_to`), not once per sender."""
    ep = len(node_of)
    nodes = _nodes(node_of, node_of)
    tokens: dict[tuple[int, ...], float] = {}

    def to(members: Sequence[int]) -> float:
        key = tuple(members)
        if key not in tokens:
            tokens[key] = d.tokens_to(members, ep)
        return tokens[key]

    out: list[tuple[int, int, float]] = []
    for i in range(ep):
        home = nodes[node_of[i]]
        position = home.index(i)
        for node, members in nodes.items():
            relay = i if node == node_of[i] else members[position % len(members)]
            if relay != i:
                out.append((i, relay, to(members) * d.row))
            out += [(relay, j, to([j]) * d.row) for j in members if j != relay]
    return tuple(f for f in out if f[2] > 0)


def link_class_bytes(flows: Sequence[Flow], node_of_rank: dict[int, int]
                     ) -> dict[int, tuple[float, float]]:
    """Per sender: (NVLink bytes, InfiniBand bytes) of these flows, a flow inside a node on
    NVLink and across nodes on InfiniBand."""
    out: dict[int, tuple[float, float]] = {}
    for a, b, size in flows:
        nv, ib = out.get(a, (0.0, 0.0))
        out[a] = (nv + size, ib) if node_of_rank[a] == node_of_rank[b] else (nv, ib + size)
    return out
