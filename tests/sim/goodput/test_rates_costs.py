"""MTTI from component counts, and the checkpoint's size from the memory model."""

from __future__ import annotations

import pytest

from sim.goodput.costs import checkpoint_bytes
from sim.goodput.fleets import FLEETS
from sim.goodput.rates import Component, component_counts, job_rates, mtti_s
from sim.models.memory import OPTIMIZER_STATE_BYTES, memory_by_pp_rank
from topology import build_cluster
from traces.layout import Layout
from traces.model import ModelSpec

HOST_ONLY = {c: 0.0 for c in Component} | {Component.HOST: 1e-4}


def test_twice_the_nodes_half_the_mtti_when_node_failures_dominate():
    small, big = (component_counts(build_cluster("dgx-h100", nodes=n)) for n in (4, 8))
    assert (small[Component.HOST], big[Component.HOST]) == (4, 8)
    one, two = (mtti_s(job_rates(HOST_ONLY, c)) for c in (small, big))
    assert one == pytest.approx(2 * two, rel=1e-12)
    assert one == pytest.approx(3600 / (4 * 1e-4), rel=1e-12)


def test_mtti_is_one_over_the_summed_rates_of_every_instance():
    counts = component_counts(build_cluster("dgx-h100", nodes=4, fabric="rail"))
    assert counts[Component.GPU] == 32 and counts[Component.NIC] == 32
    assert counts[Component.SWITCH] == 8  # one rail switch per NIC index
    assert (counts[Component.PLANNED], counts[Component.LEMON]) == (4, 1)
    rates = FLEETS["llama3-h100"].rates_per_hour
    per_hour = sum(rates.get(c, 0.0) * counts[c] for c in Component)
    assert mtti_s(job_rates(rates, counts)) == pytest.approx(3600 / per_hour)


GPT = ModelSpec(layers=8, hidden=512, heads=8, seq_len=256, vocab=4096)


@pytest.mark.parametrize(("tp", "pp", "dp", "zero"), [
    (2, 2, 4, 1), (1, 4, 2, 0), (2, 1, 8, 3), (4, 2, 2, 2)])
def test_checkpoint_is_the_memory_models_params_and_optimizer_summed(tp, pp, dp, zero):
    layout = Layout(tp=tp, pp=pp, dp=dp, zero=zero, global_batch=16)
    memory = memory_by_pp_rank(GPT, layout)
    # every rank's share, summed over the world, each replica counted once
    replicas_p = 1 if zero == 3 else dp
    replicas_o = dp if zero == 0 else 1
    summed = sum(tp * dp * (m.params_bytes / replicas_p + m.optimizer_bytes / replicas_o)
                 for m in memory)
    assert checkpoint_bytes(layout, memory) == pytest.approx(summed, rel=1e-12)


def test_checkpoint_of_an_unsharded_model_is_14_bytes_per_parameter():
    # One GPU: 2-byte weights and K = 12 bytes of optimizer state per parameter (ZeRO's K).
    layout = Layout(global_batch=1)
    memory = memory_by_pp_rank(GPT, layout)
    assert checkpoint_bytes(layout, memory) == pytest.approx(
        (2 + OPTIMIZER_STATE_BYTES) * GPT.num_params(), rel=1e-12)
