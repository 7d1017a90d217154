"""Stored activations under Megatron-Core's combined 1F1B (`parallel.overlap_moe_comm`,
sim.models.activation_memory.paired_levels): a paired step runs the forward's layer i beside the
backward's layer n - 1 - i and frees the backward's layers one by one, so the rank holds one
micro-batch and the forward's layers stored ahead of the backward's frees, not both
micro-batches whole; exact on a tiny MoE, by the layer walk and in closed form."""

from __future__ import annotations

from sim.config import experiment_from_dict
from sim.models.activation_memory import layer_bytes, pair_rise, per_pass
from sim.models.memory import memory_by_pp_rank
from sim.models.moe_memory import moe_activation_delta
from sim.search.analytic import Analytic
from traces.layout import Layout
from traces.model import ModelSpec
from traces.stored_activations import activation_bytes_per_layer

MODEL = ModelSpec(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, ffn="swiglu",
                  ffn_hidden=96, position="rope", norm="rmsnorm", bias=False, dropout=0.0,
                  experts=8, top_k=2, moe_ffn_hidden=32, shared_experts=1, dense_layers=1)
ON = Layout(dp=4, ep=4, global_batch=16, overlap_moe_comm=True)  # pp 1: F0 (F1 B0) ... B3
OFF = Layout(dp=4, ep=4, global_batch=16)


def test_the_pair_rises_by_the_forwards_layers_stored_ahead_of_the_backwards_frees():
    assert pair_rise([5.0] * 4, [5.0] * 4) == 5.0  # equal layers: one layer over what it held
    # forward 1, 2, 3 beside backward 4, 5 (its last, 5, freed first): 1; 1 - 5 + 2; ... + 3
    assert pair_rise([1.0, 2.0, 3.0], [4.0, 5.0]) == 1.0
    assert pair_rise([3.0, 3.0, 3.0], [1.0, 1.0]) == 7.0  # the longer forward runs on alone
    assert pair_rise([], [2.0]) == 0.0


def test_a_tiny_moe_holds_one_micro_batch_and_its_first_layer_with_overlap():
    dense = activation_bytes_per_layer(MODEL, ON)
    moe = dense + moe_activation_delta(MODEL, ON, 1)
    assert layer_bytes(MODEL, ON, 0) == [dense, moe, moe, moe]
    one = dense + 3 * moe
    assert per_pass(MODEL, ON, 0) == one
    # the dense layer 0 goes in before the backward frees its MoE layer 3, then each MoE
    # layer in as one leaves: the top is one pass and the dense layer
    assert memory_by_pp_rank(MODEL, ON)[0].activations_bytes == one + dense
    assert memory_by_pp_rank(MODEL, OFF)[0].activations_bytes == one  # 1F1B at pp 1


def test_the_search_screen_holds_what_the_memory_model_holds_under_the_pairs():
    """`parasim search`'s analytic tier passes the rank's own actions where the pairs decide
    (not a count of micro-batches in flight), so its activations are the memory model's."""
    exp = experiment_from_dict({
        "model": {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 4096,
                  "ffn": "swiglu", "ffn_hidden": 1024, "experts": 16, "top_k": 4,
                  "moe_ffn_hidden": 256, "shared_experts": 1, "dense_layers": 1,
                  "bias": False},
        "parallel": {"dp": 8, "ep": 8, "global_batch": 32, "overlap_moe_comm": True},
        "cluster": {"preset": "dgx-h100", "nodes": 1}})
    screen = Analytic(exp.model, exp.cluster, exp.profile).memory(exp.layout)
    model = memory_by_pp_rank(exp.model, exp.layout)
    assert [m.activations_bytes for m in screen] == [m.activations_bytes for m in model]
    one = per_pass(exp.model, exp.layout, 0)
    assert one < model[0].activations_bytes < 2 * one
