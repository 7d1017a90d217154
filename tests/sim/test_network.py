"""The flow model's dynamics: latency, then bytes at a share that changes as flows come and go."""

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.collectives import Collectives
from sim.network import FlowSet, Network
from topology import build_cluster
from traces.ops import OpKind


def run_transfers(capacity, transfers):
    """transfers: (start_s, FlowSet, bytes); returns each one's finish time."""
    env = simpy.Environment()
    net = Network(env, capacity)
    finish = {}

    def one(i, start, flows, size):
        yield env.timeout(start)
        yield net.transfer(flows, size)
        finish[i] = env.now

    for i, (start, flows, size) in enumerate(transfers):
        env.process(one(i, start, flows, size))
    env.run()
    return [finish[i] for i in range(len(transfers))]


def test_single_flow_costs_latency_plus_bytes_over_bandwidth():
    flows = FlowSet.of([(0, 1)], 2e-6, [100.0, 50.0])
    assert run_transfers([100.0, 50.0], [(0.0, flows, 10.0)]) == [pytest.approx(2e-6 + 0.2)]


def test_a_late_flow_takes_half_the_link_and_the_first_speeds_up_when_it_leaves():
    link = FlowSet.of([(0,)], 0.0, [1.0])
    # A alone for 0.5 s (0.5 B left), then both at 0.5 B/s: A ends at 1.5 s; B has 0.5 B left
    # at 1.5 s and ends at 2.0 s.
    assert run_transfers([1.0], [(0.0, link, 1.0), (0.5, link, 1.0)]) == [1.5, 2.0]


def test_transfers_on_disjoint_links_do_not_slow_each_other():
    a, b = FlowSet.of([(0,)], 0.0, [1.0]), FlowSet.of([(1,)], 0.0, [1.0, 1.0])
    assert run_transfers([1.0, 1.0], [(0.0, a, 1.0), (0.0, b, 1.0)]) == [1.0, 1.0]


def test_rates_are_recomputed_only_within_the_shared_component():
    env = simpy.Environment()
    net = Network(env, [1.0, 1.0])
    net.transfer(FlowSet.of([(0,)], 0.0, [1.0, 1.0]), 1.0)
    net.transfer(FlowSet.of([(1,)], 0.0, [1.0, 1.0]), 1.0)
    env.run()
    assert net.num_reshares == 0  # each alone on its link: its own rate, no fairness to compute
    net.transfer(FlowSet.of([(0,)], 0.0, [1.0, 1.0]), 1.0)
    net.transfer(FlowSet.of([(0, 1)], 0.0, [1.0, 1.0]), 2.0)
    env.run()
    assert net.num_reshares == 2  # the second start, and the first end freeing bandwidth
    net.transfer(FlowSet.of([(0,)], 0.0, [1.0, 1.0]), 1.0)
    net.transfer(FlowSet.of([(0, 1)], 0.0, [1.0, 1.0]), 1.0)
    env.run()
    assert net.num_reshares == 3  # both end at once: nothing left to re-share


def test_a_transfer_in_its_latency_takes_no_bandwidth():
    # B starts at 0 with 1 s of latency; A (no latency) has the link alone until B moves.
    capacity = [1.0]
    a, b = FlowSet.of([(0,)], 0.0, capacity), FlowSet.of([(0,)], 1.0, capacity)
    # A: 1 B alone in [0, 1) -> 1 B left 1 B... A carries 2 B: 1 B alone, then 1 B at 0.5 B/s
    # until 3 s; B: 1 B from t = 1 at 0.5 B/s until 3 s.
    assert run_transfers(capacity, [(0.0, a, 2.0), (0.0, b, 1.0)]) == [3.0, 3.0]


def test_zero_bytes_cost_only_latency():
    assert run_transfers([1.0], [(0.0, FlowSet.of([(0,)], 3e-6, [1.0]), 0.0)]) == [3e-6]


@st.composite
def collective_mixes(draw):
    """Collectives on one DGX H100 that overlap in time on shared NVLinks."""
    jobs = []
    for _ in range(draw(st.integers(2, 6))):
        group = tuple(sorted(draw(st.sets(st.integers(0, 7), min_size=2, max_size=8))))
        algo = draw(st.sampled_from(["ring", "rhd"]))
        start = draw(st.floats(0.0, 2e-4))
        size = draw(st.integers(1, 2**26))
        jobs.append((group, algo, start, size))
    return jobs


@settings(max_examples=60, deadline=None)
@given(collective_mixes())
def test_analytic_shortcut_is_exact_even_when_interrupted(jobs):
    """Collectives start on the analytic path and fall back to flows when others arrive;
    every finish time equals that of a network that never takes the shortcut."""
    cluster = build_cluster("dgx-h100", nodes=1)
    col = Collectives(cluster)
    plans = []
    for group, algo, start, size in jobs:
        lowering = col.lowering(OpKind.ALL_REDUCE, group, algo)
        if lowering is None:
            lowering = col.lowering(OpKind.ALL_REDUCE, group, "ring")
        plans.append((start, lowering, size))

    def finish_times(shortcut: bool) -> list[float]:
        env = simpy.Environment()
        net = Network(env, cluster.link_capacity, analytic_path=shortcut)
        finish = {}

        def one(i, start, lowering, size):
            yield env.timeout(start)
            yield net.run(lowering, size)
            finish[i] = env.now

        for i, plan in enumerate(plans):
            env.process(one(i, *plan))
        env.run()
        return [finish[i] for i in range(len(plans))]

    assert finish_times(True) == pytest.approx(finish_times(False), rel=1e-9)
