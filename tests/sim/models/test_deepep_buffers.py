"""DeepEP's NVLink and RDMA buffers (sim.models.deepep_buffers) against DeepEP's size hints
worked by hand for DeepSeek-V3's EP64 (h 7168) and one node's EP8."""

from __future__ import annotations

import dataclasses

from sim.models.deepep_buffers import deepep_buffer_bytes, nvl_bytes, rdma_bytes
from sim.models.memory import memory_by_pp_rank, working_bytes
from traces.layout import Layout
from traces.model import ModelSpec

HIDDEN_BYTES = 2 * 7168  # bf16 tokens: h * max(element size, 2)
TOKEN = HIDDEN_BYTES + 8 + 128 * 8 + 128 * 4 + 128 * 4  # + meta, top-k idx/weights, scales


def test_ep64_over_8_nodes_is_deepeps_hint():
    # 10 channels (20 SMs), 8 NVLink peers, 8 RDMA peers; NVL 288 tokens (both configs)
    nvl = 10 * 8 * (2 * 8 + 3) * 4 + 10 * 8 * 288 * TOKEN
    assert nvl == 377_677_760  # then aligned up to 128 bytes
    assert nvl_bytes(288, HIDDEN_BYTES, 64) == nvl + 64 == 377_677_824
    # RDMA: 128 receive tokens rounded up to a multiple of the send chunk (28, 20): 140
    rdma = 10 * 8 * (8 * 2 + 2) * 2 * 4 + 10 * 8 * 140 * (TOKEN + 16) * 2 + 2**20
    assert rdma_bytes(28, 128, HIDDEN_BYTES, 64) == rdma == 368_599_296
    assert rdma_bytes(20, 128, HIDDEN_BYTES, 64) == rdma


def test_inside_one_node_there_is_no_rdma_buffer():
    assert rdma_bytes(6, 128, HIDDEN_BYTES, 8) == 0
    nvl = 10 * 8 * (5 * 4 + 256 * TOKEN)
    assert nvl_bytes(256, HIDDEN_BYTES, 8) == -(-nvl // 128) * 128


def test_every_rank_holds_the_buffers_with_deepep_only():
    model = ModelSpec(layers=4, hidden=7168, heads=8, seq_len=64, vocab=256, experts=64,
                      top_k=2, moe_ffn_hidden=256, dispatch="deepep")
    layout = Layout(dp=64, ep=64, pp=2, global_batch=128)
    assert deepep_buffer_bytes(model, layout) == 377_677_824 + 368_599_296
    nccl = dataclasses.replace(model, dispatch="nccl")
    assert deepep_buffer_bytes(nccl, layout) == 0
    for pp_rank in (0, 1):
        assert working_bytes(model, layout, pp_rank) - working_bytes(nccl, layout, pp_rank) \
            == 377_677_824 + 368_599_296
    with_ep, without = memory_by_pp_rank(model, layout), memory_by_pp_rank(nccl, layout)
    assert [m.activations_bytes for m in with_ep] == [m.activations_bytes for m in without]
