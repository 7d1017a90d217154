"""The flow model's dynamics: latency, then bytes at a share that changes as flows come and go."""

import pytest
import simpy

from sim.network import FlowSet, Network


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
    net.transfer(FlowSet.of([(0, 1)], 0.0, [1.0, 1.0]), 1.0)
    env.run()
    assert net.num_reshares == 2  # the second start, and the first end freeing bandwidth


def test_a_transfer_in_its_latency_takes_no_bandwidth():
    # B starts at 0 with 1 s of latency; A (no latency) has the link alone until B moves.
    capacity = [1.0]
    a, b = FlowSet.of([(0,)], 0.0, capacity), FlowSet.of([(0,)], 1.0, capacity)
    # A: 1 B alone in [0, 1) -> 1 B left 1 B... A carries 2 B: 1 B alone, then 1 B at 0.5 B/s
    # until 3 s; B: 1 B from t = 1 at 0.5 B/s until 3 s.
    assert run_transfers(capacity, [(0.0, a, 2.0), (0.0, b, 1.0)]) == [3.0, 3.0]


def test_zero_bytes_cost_only_latency():
    assert run_transfers([1.0], [(0.0, FlowSet.of([(0,)], 3e-6, [1.0]), 0.0)]) == [3e-6]
