"""The flow model's dynamics: latency, then bytes at a share that changes as flows come and go."""

import math

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.collectives import Collectives
from sim.engine import due_heap
from sim.engine.flows import FlowSet, solo_time
from sim.engine.loop import Loop
from sim.engine.network import Network
from topology import build_cluster
from traces.alltoallv import AllToAllv
from traces.ops import OpKind


def run_transfers(capacity, transfers, net=None):
    """transfers: (start_s, FlowSet, bytes); returns each one's finish time. Each runs as a
    one-round lowering on the flow path (no analytic shortcut)."""
    net = net or Network(simpy.Environment(), capacity, analytic_path=False)
    env = net.env
    finish = {}

    def one(i, start, flows, size):
        yield env.timeout(start)
        yield net.run(net.register((((flows, 1.0),),)), size)
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
    capacity = [1.0, 1.0]
    net = Network(simpy.Environment(), capacity, analytic_path=False)
    a, b, ab = (FlowSet.of([links], 0.0, capacity) for links in [(0,), (1,), (0, 1)])
    run_transfers(capacity, [(0.0, a, 1.0), (0.0, b, 1.0)], net)
    assert net.num_reshares == 0  # each alone on its link: its own rate, no fairness to compute
    run_transfers(capacity, [(0.0, a, 1.0), (0.0, ab, 2.0)], net)
    assert net.num_reshares == 2  # the second start, and the first end freeing bandwidth
    run_transfers(capacity, [(0.0, a, 1.0), (0.0, ab, 1.0)], net)
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


def test_alone_a_lowering_takes_its_alpha_beta_time():
    # Two rounds on a 2 B/s link, 1e-3 s latency each: 1e-3 + 0.5·8/2, then 1e-3 + 0.25·8/2.
    capacity = [2.0]
    flows = FlowSet.of([(0,)], 1e-3, capacity)
    assert flows.solo_time(4.0) == 1e-3 + 4.0 / 2.0
    lowering = (((flows, 0.5),), ((flows, 0.25),))
    assert solo_time(lowering, 8.0, capacity) == pytest.approx(2e-3 + 2.0 + 1.0, rel=1e-12)
    env = simpy.Environment()
    net = Network(env, capacity)
    done = net.run(net.register(lowering), 8.0)
    env.run(until=done)
    assert env.now == solo_time(lowering, 8.0, capacity)


@pytest.mark.parametrize("shortcut", [True, False])
def test_a_stretched_lowering_takes_its_time_times_the_stretch(shortcut):
    """`run(handle, size, stretch)`: every latency and byte `stretch` times over (a busy host,
    `compute_interference`), on the analytic path and on flows alike."""
    capacity = [2.0]
    flows = FlowSet.of([(0,)], 1e-3, capacity)
    lowering = (((flows, 0.5),), ((flows, 0.25),))
    env = simpy.Environment()
    net = Network(env, capacity, analytic_path=shortcut)
    done = net.run(net.register(lowering), 8.0, 2.5)
    env.run(until=done)
    assert env.now == pytest.approx(2.5 * (2e-3 + 2.0 + 1.0), rel=1e-12)


def test_lowerings_are_interned_by_value():
    capacity = [1.0, 1.0]
    net = Network(simpy.Environment(), capacity)

    def lowering(link):  # a fresh but equal value on every call
        return (((FlowSet.of([(link,)], 0.0, capacity), 1.0),),)

    assert net.register(lowering(0)) == net.register(lowering(0)) == 0
    assert net.register(lowering(1)) == 1


@pytest.mark.parametrize("latency", [math.inf, math.nan, -1e-6])
def test_a_flow_set_never_has_an_unusable_latency(latency):
    with pytest.raises(AssertionError):
        FlowSet.of([(0,)], latency, [1.0])


@pytest.mark.parametrize("capacity", [math.inf, 0.0, math.nan])
def test_the_network_never_has_an_unusable_capacity(capacity):
    with pytest.raises(AssertionError):
        Network(simpy.Environment(), [1.0, capacity])
    with pytest.raises(AssertionError):
        FlowSet.of([(1,)], 0.0, [1.0, capacity])


H100 = build_cluster("dgx-h100", nodes=1)
H100_COLLECTIVES = Collectives(H100)


@st.composite
def collective_mixes(draw):
    """All-reduces on one DGX H100 that overlap in time on shared NVLinks, each with one of
    the algorithms that apply to its group."""
    jobs = []
    for _ in range(draw(st.integers(2, 6))):
        group = tuple(sorted(draw(st.sets(st.integers(0, 7), min_size=2, max_size=8))))
        algo = draw(st.sampled_from(H100_COLLECTIVES.applicable(OpKind.ALL_REDUCE, group)))
        start = draw(st.floats(0.0, 2e-4))
        size = draw(st.integers(1, 2**26))
        stretch = draw(st.sampled_from((1.0, 1.0, 2.5)))
        jobs.append((group, algo, start, size, stretch))
    return jobs


@settings(max_examples=60, deadline=None)
@given(collective_mixes())
def test_analytic_shortcut_is_exact_even_when_interrupted(jobs):
    """Collectives start on the analytic path and fall back to flows when others arrive;
    every finish time equals that of a network that never takes the shortcut, stretched
    ones (a busy host) included, and the network's in-flight sets empty at the end."""
    plans = [(start, H100_COLLECTIVES.lowering(OpKind.ALL_REDUCE, group, algo), size, stretch)
             for group, algo, start, size, stretch in jobs]

    def finish_times(shortcut: bool) -> list[float]:
        env = simpy.Environment()
        net = Network(env, H100.link_capacity, analytic_path=shortcut)
        finish = {}

        def one(i, start, lowering, size, stretch):
            yield env.timeout(start)
            yield net.run(net.register(lowering), size, stretch)
            finish[i] = env.now

        for i, plan in enumerate(plans):
            env.process(one(i, *plan))
        env.run()
        # all done: no flow set is left marked as having transfers or jobs in flight
        assert not net._live and not net._jobbed
        return [finish[i] for i in range(len(plans))]

    assert finish_times(True) == pytest.approx(finish_times(False), rel=1e-9)


def test_the_rates_of_a_combination_are_computed_once_and_equal_a_fresh_computation():
    """Three rounds of the same two contending transfers: the max-min rates of the pair are
    asked at every start and end but computed once, and each round's finish times equal
    those of the first round (and those of a network that recomputes them)."""
    capacity = [1.0, 2.0]
    a, b = FlowSet.of([(0, 1)], 0.0, capacity), FlowSet.of([(0,)], 0.0, capacity)
    net = Network(simpy.Environment(), capacity, analytic_path=False)
    computed = []
    max_min = net._max_min
    net._max_min = lambda indices: computed.append(indices) or max_min(indices)  # type: ignore
    rounds = [run_transfers(capacity, [(0.0, a, 1.0), (0.0, b, 2.0)], net) for _ in range(3)]
    starts = [r[0] - rounds[0][0] for r in rounds]
    # A and B share link 0 (1 B/s): 0.5 B/s each until A's 1 B is done at 2 s, then B's
    # last 1 B alone at 1 B/s: 3 s
    fresh = run_transfers(capacity, [(0.0, a, 1.0), (0.0, b, 2.0)])
    assert fresh == [2.0, 3.0]
    assert [[t - s for t in r] for r, s in zip(rounds, starts, strict=True)] == [fresh] * 3
    assert computed == [(0, 1)]  # the pair's rates once; alone, each runs at its own rate


def _skewed_exchanges(env, net, cluster, timeline):
    """Uneven all-to-alls (a skewed MoE's dispatches and combines) on overlapping groups of
    `cluster`, started at staggered instants, some at one instant, with all-reduces among
    them; `timeline` gets (time, name) at each end, in the order they happen."""
    collectives = Collectives(cluster)
    n = cluster.num_devices
    everyone, evens = tuple(range(n)), tuple(range(0, n, 2))
    jobs = []
    for k, group in enumerate([everyone, evens, everyone, everyone[n // 4:]]):
        sizes = tuple(float((1 + (k + 3 * m) % 7) * 2**16) for m in range(len(group)))
        for by_sender in (False, True):
            split = AllToAllv(sizes, by_sender)
            lowering = collectives.lowering(OpKind.ALL_TO_ALL, group, "direct", None, split)
            jobs.append((f"a2a{k}{by_sender:d}", k * 1e-5 * (k % 3), lowering,
                         split.mean_send_bytes))
    ring = collectives.lowering(OpKind.ALL_REDUCE, everyone, "ring")
    jobs += [("ar0", 0.0, ring, 2.0**22), ("ar1", 2e-5, ring, 2.0**20)]

    def one(name, start, lowering, size):
        yield env.timeout(start)
        yield net.run(net.register(lowering), size)
        timeline.append((env.now, name))

    for job in jobs:
        env.process(one(*job))


@pytest.mark.parametrize("environment", [simpy.Environment, Loop])
@pytest.mark.parametrize("shortcut", [True, False])
@pytest.mark.parametrize("compact_from", [due_heap.COMPACT_FROM, 4])
def test_the_due_heap_gives_every_end_of_per_event_timeouts(environment, shortcut,
                                                            compact_from, monkeypatch):
    """The network's own heap of transfer events (`Network._schedule`, superseded entries
    never events; dropped all at once past `sim.engine.due_heap.COMPACT_FROM`, here also
    every few) against one simpy timeout per scheduling (`timeouts=True`, as before it): on
    skewed all-to-alls that re-share at every end, the same end times, float for float, in
    the same order, and the same number of re-shares. At every re-share the sets in flight
    near each set in flight (`_live_near`) are those of its `_near` in flight."""
    monkeypatch.setattr(due_heap, "COMPACT_FROM", compact_from)
    cluster = build_cluster("dgx-h100", nodes=2)
    runs = []
    for timeouts in (True, False):
        env, timeline = environment(), []
        net = Network(env, cluster.link_capacity, analytic_path=shortcut, timeouts=timeouts)
        flush = net._flush

        def checked(net=net, flush=flush):
            assert net._live_near == {i: net._near[i] & net._live for i in net._live}
            flush()

        net._flush = checked  # type: ignore[method-assign]
        _skewed_exchanges(env, net, cluster, timeline)
        env.run()
        assert not net._live and not net._jobbed and not net._dues.heap and not net._live_near
        runs.append((timeline, net.num_reshares))
    assert runs[0][1] > 20  # ends re-share the others: the heap is exercised
    assert runs[0] == runs[1]
