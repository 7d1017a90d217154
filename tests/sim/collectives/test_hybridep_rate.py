"""HybridEP's measured pace inside one NVLink domain (`sim.collectives.hybridep_rate`): an op
takes max(its flows alone, received bytes / the README's rate), DeepEP's ops and unmeasured
systems keep their flows' time, and the dispatcher survives a trace file."""

from __future__ import annotations

import dataclasses

import pytest

from sim.collectives.deepep import lower_deepep
from sim.collectives.hybridep_rate import RATES, TAKEN_FROM, measured_rate, received_bytes
from sim.engine.flows import solo_time
from topology.config import build_cluster
from traces.alltoallv import AllToAllv, deepep_split
from traces.deepep import deepep_flows, from_json, to_json
from traces.model import ModelSpec
from traces.moe_spec import expert_counts

M = ModelSpec(layers=4, hidden=7168, heads=4, seq_len=4096, vocab=128, experts=64, top_k=8,
              dispatch="hybridep")
"""The README's benchmark shape: hidden 7,168, top-8, 8 local experts on 8 ranks."""


def split_of(model: ModelSpec, ep: int, by_sender: bool) -> AllToAllv:
    """One rank's dispatch (or combine) of 4,096 tokens in BF16 rows."""
    tokens, row = 4096, model.hidden * 2.0
    counts = expert_counts(model, 1, tokens)
    per = model.experts // ep
    sizes = [row * sum(counts[j * per:(j + 1) * per]) for j in range(ep)]
    split = deepep_split(model, counts, tokens, row, sizes)
    return split.transpose() if by_sender else split


def test_received_bytes_are_the_flows_into_a_rank_plus_its_own_tokens():
    group = tuple(range(8))
    d = split_of(M, 8, False).deepep
    assert d is not None
    flows = deepep_flows(d, group, [0] * 8)
    into = [sum(size for _, b, size in flows if b == j) + d.tokens_to([j], 8) * d.row
            for j in group]
    assert received_bytes(d, 8) == pytest.approx(max(into), rel=1e-12)


@pytest.mark.parametrize("by_sender, rate", [(False, 535.94e9), (True, 530.86e9)])
def test_b200_op_takes_the_longer_of_its_flows_and_the_measured_rate(by_sender, rate):
    cluster = build_cluster("dgx-b200", nodes=1)
    group = tuple(range(8))
    hybrid = split_of(M, 8, by_sender)
    deep = split_of(dataclasses.replace(M, dispatch="deepep"), 8, by_sender)
    assert hybrid.deepep is not None and RATES[(cluster.accelerator.name, 8)] == \
        (535.94e9, 530.86e9)
    flows = solo_time(lower_deepep(cluster, group, deep), deep.mean_send_bytes,
                      cluster.link_capacity)
    floor = received_bytes(hybrid.deepep, 8) / rate
    got = solo_time(lower_deepep(cluster, group, hybrid), hybrid.mean_send_bytes,
                    cluster.link_capacity)
    assert floor > flows  # the kernels, not NVLink 5, set the pace at 16 SMs
    assert got == pytest.approx(max(flows, floor), rel=1e-12)


def test_unmeasured_systems_and_groups_across_domains_keep_their_flows():
    for preset, nodes, group in (("dgx-h100", 1, tuple(range(8))),
                                 ("dgx-b200", 2, tuple(range(16)))):
        cluster = build_cluster(preset, nodes=nodes)
        hybrid = split_of(M, len(group), False)
        deep = split_of(dataclasses.replace(M, dispatch="deepep"), len(group), False)
        assert lower_deepep(cluster, group, hybrid) == lower_deepep(cluster, group, deep)


def test_the_dispatcher_survives_a_trace_file_and_deepep_files_are_unchanged():
    hybrid = split_of(M, 8, False).deepep
    deep = split_of(dataclasses.replace(M, dispatch="deepep"), 8, False).deepep
    assert hybrid is not None and deep is not None
    assert from_json(to_json(hybrid)) == hybrid and hybrid.dispatch == "hybridep"
    assert "dispatch" not in to_json(deep) and from_json(to_json(deep)) == deep


def test_blackwell_ultra_takes_blackwells_figures():
    for ultra, preset, ep in (("B300-SXM-288GB", "dgx-b300", 8),
                              ("GB300-288GB", "gb300-nvl72", 32)):
        cluster = build_cluster(preset, nodes=1)
        assert cluster.accelerator.name == ultra
        group = tuple(range(ep))
        for by_sender in (False, True):
            rate = RATES[(TAKEN_FROM[ultra], ep)][1 if by_sender else 0]
            assert measured_rate(cluster, group, split_of(M, ep, by_sender)) == rate
