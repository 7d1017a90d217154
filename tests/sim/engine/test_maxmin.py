"""Max-min fair sharing: textbook allocations and the optimality conditions."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.maxmin import max_min_matrix, max_min_rates


def test_two_flows_on_one_link_get_half_each():
    assert max_min_rates([((0,), (1,)), ((0,), (1,))], [10.0]) == [5.0, 5.0]


def test_three_flows_with_different_bottlenecks():
    # f1 on A (cap 10), f2 on A and B, f3 on B (cap 4): B splits 2/2, f1 takes A's remaining 8.
    rates = max_min_rates([((0,), (1,)), ((0, 1), (1, 1)), ((1,), (1,))], [10.0, 4.0])
    assert rates == [8.0, 2.0, 2.0]


def test_parking_lot():
    # One long flow across three unit links, one short flow per link: all get 1/2.
    groups = [((0, 1, 2), (1, 1, 1)), ((0,), (1,)), ((1,), (1,)), ((2,), (1,))]
    assert max_min_rates(groups, [1.0, 1.0, 1.0]) == [0.5] * 4


def test_a_group_counts_once_per_flow_on_a_link():
    # A ring of two flows sharing link 0 with a single flow: three flows, a third each.
    assert max_min_rates([((0,), (2,)), ((0,), (1,))], [3.0]) == [1.0, 1.0]


def test_group_without_links_is_unbounded():
    assert max_min_rates([((), ())], []) == [float("inf")]


@st.composite
def instances(draw):
    num_links = draw(st.integers(1, 6))
    capacity = draw(st.lists(st.floats(0.5, 100.0), min_size=num_links, max_size=num_links))
    groups = []
    for _ in range(draw(st.integers(1, 8))):
        links = draw(st.lists(st.integers(0, num_links - 1), min_size=1, max_size=num_links,
                              unique=True))
        counts = draw(st.lists(st.integers(1, 3), min_size=len(links), max_size=len(links)))
        groups.append((tuple(links), tuple(counts)))
    return groups, capacity


@settings(max_examples=300, deadline=None)
@given(instances())
def test_allocation_is_feasible_and_every_group_has_a_saturated_bottleneck(instance):
    groups, capacity = instance
    rates = max_min_rates(groups, capacity)
    used = [0.0] * len(capacity)
    for (links, counts), rate in zip(groups, rates):
        for link, count in zip(links, counts):
            used[link] += count * rate
    for link, cap in enumerate(capacity):
        assert used[link] <= cap * (1 + 1e-9)
    # Max-min optimality: each group crosses a saturated link where no flow gets more than it.
    for (links, _), rate in zip(groups, rates):
        assert any(
            used[link] == pytest.approx(capacity[link], rel=1e-9)
            and all(r <= rate * (1 + 1e-9) for (ls, _), r in zip(groups, rates) if link in ls)
            for link in links
        )


@settings(max_examples=300, deadline=None)
@given(instances())
def test_matrix_solver_equals_the_reference(instance):
    groups, capacity = instance
    links = sorted({link for ls, _ in groups for link in ls})
    counts = np.zeros((len(links), len(groups)))
    for g, (ls, ns) in enumerate(groups):
        for link, n in zip(ls, ns):
            counts[links.index(link), g] = n
    fast = max_min_matrix(counts, np.array([capacity[link] for link in links]))
    assert list(fast) == pytest.approx(max_min_rates(groups, capacity), rel=1e-9)


def test_arrays_give_the_dict_form_floats(monkeypatch) -> None:
    """The array form (large groups) equals the dict form float for float, ties included."""
    import random

    from sim.engine import maxmin

    monkeypatch.setattr(maxmin, "ARRAY_FROM", 10**9)  # max_min_rates: the dict form
    rng = random.Random(7)
    capacity = [rng.choice((1e9, 2.5e10, 5e10, 4.5e11)) for _ in range(3000)]
    for trial in range(6):
        groups = []
        for _ in range(rng.randint(1, 9)):
            links = sorted(rng.sample(range(3000), rng.randint(0, 2500)))
            groups.append((tuple(links), tuple(rng.randint(1, 40) for _ in links)))
        want = maxmin.max_min_rates(groups, capacity)
        assert maxmin._on_arrays(groups, capacity) == want, trial
