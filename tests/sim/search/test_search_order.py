"""The order `parasim search` sends its work in, which changes no result: the screen's chunks
cut from the affinity order (results back in the space's order), the engines' start / wait,
and the simulations' cost (the costliest first).

    pytest tests/sim/search/test_search_order.py -q
"""

import dataclasses

from sim.search.cost import simulation_cost
from sim.search.engines import InProcess
from sim.search.problem import context, problem_from_dict
from sim.search.run import PIPELINE_KEYS, _screened, _start_screen, affinity_order, screen_chunk
from tests.sim.search.search_cases import SMALL
from traces.layout import Layout


def test_the_affinity_order_groups_candidates_that_differ_only_in_the_pipeline():
    ctx = context(problem_from_dict(SMALL, name="small"))
    tables = list(ctx.space.candidates())
    order = affinity_order(tables)
    assert sorted(order) == list(range(len(tables)))
    keys = [tuple((k, v) for k, v in tables[i].items() if k not in PIPELINE_KEYS)
            for i in order]
    runs = [k for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]]
    assert len(runs) == len(set(keys))  # each group in one run
    assert order != list(range(len(tables)))  # the space's order runs pp slowly


def test_an_unhashable_value_keeps_the_space_order():
    tables = [{"tp": 1, "x": [1]}, {"tp": 2, "x": [1]}, {"tp": 1, "x": [2]}]
    assert affinity_order(tables) == [0, 1, 2]


def test_the_screen_gives_the_space_order_whatever_the_chunks():
    problem = problem_from_dict(SMALL, name="small")
    tables = list(context(problem).space.candidates())
    order, pending = _start_screen(InProcess(), problem, tables)
    screened, _ = _screened(pending, order, None)
    alone, _ = screen_chunk(problem, tables)
    assert screened == alone


def test_in_process_tasks_run_when_waited_for():
    ran = []
    problem = problem_from_dict(SMALL, name="small")
    engine = InProcess()
    first = engine.start(lambda _, x: ran.append(x) or x * 2, problem, [1, 2])
    second = engine.start(lambda _, x: ran.append(x) or x * 3, problem, [5])
    assert ran == []
    done = []
    assert second.wait(lambda i, r: done.append((i, r))) == [15]
    assert first.wait() == [2, 4]
    assert ran == [5, 1, 2] and done == [(0, 15)]


def test_collectives_leaving_a_server_cost_more_to_simulate():
    ctx = context(problem_from_dict(SMALL, name="small"))
    # 16 GPUs on two servers: dp 2 of tp 8 reduces across them, dp 2 of tp 4 x pp 2 too;
    # ZeRO-2 reduces its buckets in every micro-batch, ZeRO-1 once
    base = Layout(tp=8, pp=1, dp=2, micro_batch=1, global_batch=16, zero=1)
    every = dataclasses.replace(base, zero=2)
    assert simulation_cost(ctx.analytic, every) > simulation_cost(ctx.analytic, base)
    inside = Layout(tp=2, pp=1, dp=4, micro_batch=1, global_batch=16, zero=0)
    across = Layout(tp=8, pp=1, dp=2, micro_batch=1, global_batch=16, zero=0)
    assert ctx.analytic.group(inside, "dp") == (0, 2, 4, 6)  # one server
    assert simulation_cost(ctx.analytic, across) > simulation_cost(ctx.analytic, inside) > 0
