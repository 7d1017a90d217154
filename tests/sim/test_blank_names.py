"""Meaning no longer rides on names: the shipped examples' plans, every op's name blanked,
simulate to the same start and end of every op (the compute model keys on each op's kernel,
from its purpose; the layout search and the lowering read purposes too)."""

from __future__ import annotations

import dataclasses

import pytest

from sim.config import EXAMPLES, example_path, load_experiment
from sim.engine.replay import replay
from sim.models.compute import ComputeModel
from traces.ops import Trace
from traces.plan import build


def _blank(plan: Trace) -> Trace:
    return dataclasses.replace(plan, ops={r: tuple(dataclasses.replace(op, name="") for op in ops)
                                          for r, ops in plan.ops.items()})


SLOW = ("llama3-70b-h100.toml", "qwen3-235b-a22b-256-b200.toml", "gpt3-175b-1024-a100.toml",
        "llama3-405b-16k-h100-goodput.toml")
"""The examples whose two simulations take over ~5 s (10 to 27 s on 2 loaded cores)."""


@pytest.mark.parametrize("example", [pytest.param(e, marks=pytest.mark.slow) if e in SLOW else e
                                     for e in EXAMPLES])
def test_a_plan_without_names_simulates_to_the_same_times(example):
    exp = load_experiment(example_path(example))
    layout = exp.layout
    if layout.world > 256:  # the 1024-GPU example: its layout, fewer micro-batches
        layout = dataclasses.replace(
            layout, global_batch=layout.micro_batch * layout.dp * layout.pp * 2)
    plan = build(exp.model, layout, ranks=layout.representatives())
    compute = ComputeModel(exp.cluster.accelerator, exp.profile)
    named = replay(plan, exp.cluster, compute, network=exp.network, algo=exp.algo)
    blank = replay(_blank(plan), exp.cluster, ComputeModel(exp.cluster.accelerator, exp.profile),
                   network=exp.network, algo=exp.algo)
    assert blank.starts == named.starts and blank.ends == named.ends
    assert blank.algorithms == named.algorithms
    assert not any(op.name for ops in _blank(plan).ops.values() for op in ops)
