"""HybridEP's dispatch and combine buffers (`[model] dispatch = "hybridep"`): GPU memory each
rank of an expert-parallel group allocates once, as NVIDIA's HybridEpBuffer::allocate_buffer
does (deepseek-ai/DeepEP, csrc/hybrid_ep/hybrid_ep.cu @017a5202).

With M the tokens per rank (`max_num_of_tokens_per_rank`: the rank's routed tokens here),
R the ranks of one NVLink domain (`num_of_ranks_per_node`), N = ep / R domains
(`num_of_nodes`), X = M·R·N the worst case of tokens for one rank's experts (all routed to
it), P = (E/ep)·R the probabilities per token (the domain's experts), e the dispatched
token's bytes (2 for bf16, 1 for FP8):

    combine   X·h·2 + X·P·4                                   (expert_input token, prob)
              + 2·(M·(N-1)·h·2 + M·(N-1)·P·4)                 (intra-node reduction and
                                                               inter-node group, RDMA)
    dispatch  X·h·e + X·P·4, shared with the combine's when N = 1 (one domain)
              + M·(N-1)·h·e + M·(N-1)·P·4                     (inter-node group, RDMA)
    FP8       + X·(h/128)·4 + M·(N-1)·(h/128)·4               (scaling factors)

Left out: the per-chunk RDMA flags (8 bytes per chunk of tokens per other domain), the
preprocessing scratch (blocks x R states) and a few completion flags: bytes, not MiB.
At that commit the constructor accepts one domain only (group_size <= R); the N > 1 terms
are its allocation code as written.

In a layout (`hybridep_layout_bytes`) M is the rank's tokens of one micro-batch (its SP shard,
s/cp·b/tp, as the plan dispatches them), R the members of its EP group on its own NVLink domain
(the cluster's server: `traces.hybridep`), the dispatched tokens bf16 as the plan's rows.
"""

from __future__ import annotations

import dataclasses
import math

from traces.expert_grid import ep_group
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe import rank_tokens

SCALE_BLOCK = 128
"""FP8 dispatch: one fp32 scaling factor per 128 hidden values."""
DEFAULT_DOMAIN = 8
"""GPUs per NVLink domain where the caller names none: a DGX/HGX server's 8."""


def hybridep_buffer_bytes(hidden: int, tokens: int, experts: int, ep: int, domain: int,
                          fp8_dispatch: bool = False) -> int:
    """Bytes one rank's HybridEpBuffer allocates (module docstring); `domain` ranks share an
    NVLink domain (at most `ep`)."""
    r = min(domain, ep)
    n = math.ceil(ep / r)
    m, p = tokens, experts // ep * r
    x = m * r * n
    e = 1 if fp8_dispatch else 2
    remote = m * (n - 1)
    combine = x * hidden * 2 + x * p * 4 + 2 * (remote * hidden * 2 + remote * p * 4)
    dispatch = remote * hidden * e + remote * p * 4
    if n > 1:
        dispatch += x * hidden * e + x * p * 4
    if fp8_dispatch:
        dispatch += (x + remote) * (hidden // SCALE_BLOCK) * 4
    return combine + dispatch


def domain_members(layout: Layout, domain: int) -> int:
    """Members of an EP group on one NVLink domain of `domain` GPUs: those of rank 0's group
    on its domain (every group is placed alike)."""
    return sum(1 for r in ep_group(layout, 0) if r // domain == 0)


def hybridep_layout_bytes(model: ModelSpec, layout: Layout, domain: int | None) -> int:
    """`hybridep_buffer_bytes` of one GPU of this layout on NVLink domains of `domain` GPUs
    (module docstring); 0 without experts across ranks or with another dispatch."""
    if model.dispatch != "hybridep" or not model.experts or layout.ep == 1:
        return 0
    local = dataclasses.replace(model, seq_len=model.seq_len // layout.cp)
    tokens = rank_tokens(local, layout.micro_batch, layout.tp)
    members = domain_members(layout, domain or DEFAULT_DOMAIN)
    return hybridep_buffer_bytes(model.hidden, tokens, model.experts, layout.ep, members)

