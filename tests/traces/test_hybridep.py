"""HybridEP's byte matrix per link class on 2 NVLink domains, in closed form: each token
crosses the network once per other domain and NVLink once per other GPU of a domain."""

from __future__ import annotations

from math import comb

import pytest

from traces.alltoallv import deepep_split
from traces.deepep import DeepEp, link_class_bytes, nccl_flows
from traces.hybridep import hybridep_flows
from traces.model import ModelSpec
from traces.moe_spec import expert_counts

M = ModelSpec(layers=2, hidden=7168, heads=4, seq_len=4096, vocab=128, experts=64, top_k=8,
              dispatch="hybridep")
T, ROW = 4096, 7168 * 2
EP, DOMAIN = 16, 8  # 2 NVLink domains of 8 GPUs, 4 experts per GPU, 32 per domain
GROUP = tuple(range(EP))
DOMAIN_OF = [j // DOMAIN for j in GROUP]


def _route() -> DeepEp:
    counts = expert_counts(M, 1, T)
    assert list(counts) == [T * 8 // 64] * 64  # balanced: 512 pairs per expert
    split = deepep_split(M, counts, T, ROW, [0.0] * EP)
    assert split.deepep is not None
    return split.deepep


def _missing(n: int) -> float:
    """P(a token's 8 of 64 experts avoid n given experts)."""
    return comb(64 - n, 8) / comb(64, 8)


def test_hybridep_bytes_per_link_class_in_closed_form():
    got = link_class_bytes(hybridep_flows(_route(), GROUP, DOMAIN_OF),
                           dict(zip(GROUP, DOMAIN_OF, strict=True)))
    per_domain = T * (1 - _missing(32)) * ROW  # tokens reaching the other domain's 32 experts
    per_gpu = T * (1 - _missing(4)) * ROW  # tokens reaching one GPU's 4 experts
    for i in GROUP:
        # network: once to the other domain's relay; NVLink: to its own 7 peers, and forwarding
        # the other domain's sender at its position to its 7 peers
        assert got[i][1] == pytest.approx(per_domain, rel=1e-12)
        assert got[i][0] == pytest.approx(14 * per_gpu, rel=1e-12)
    nccl = link_class_bytes(nccl_flows(_route(), GROUP, DOMAIN_OF),
                            dict(zip(GROUP, DOMAIN_OF, strict=True)))
    assert nccl[0] == (7 * 4 * 512 * ROW, 8 * 4 * 512 * ROW)  # one row per (token, expert)


def test_one_nvl72_domain_moves_nothing_over_the_network():
    flows = hybridep_flows(_route(), GROUP, [0] * EP)
    per_gpu = T * (1 - _missing(4)) * ROW
    got = link_class_bytes(flows, dict.fromkeys(GROUP, 0))
    assert all(got[i] == pytest.approx((15 * per_gpu, 0.0), rel=1e-12) for i in GROUP)
