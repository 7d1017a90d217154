"""HybridEP's buffers (sim.models.hybridep_buffers) against HybridEpBuffer::allocate_buffer
(deepseek-ai/DeepEP csrc/hybrid_ep/hybrid_ep.cu @017a5202) worked by hand for a
Qwen3-235B-A22B layer (h 4096, 128 experts) and 4,096 tokens a rank."""

from __future__ import annotations

from sim.models.hybridep_buffers import hybridep_buffer_bytes

H, E, M = 4096, 128, 4096


def test_one_domain_shares_the_dispatch_buffers_with_the_combine():
    # EP 8 on one 8-GPU node: X = 4096 x 8 tokens, P = 16 x 8 probabilities, no RDMA
    assert hybridep_buffer_bytes(H, M, E, 8, 8) == 32768 * 4096 * 2 + 32768 * 128 * 4 \
        == 285_212_672
    # EP 64 inside one NVL72 rack: X = 4096 x 64, P = 2 x 64: 2.125 GiB
    assert hybridep_buffer_bytes(H, M, E, 64, 72) == 2_281_701_376


def test_two_domains_add_the_rdma_buffers_and_their_own_dispatch_buffers():
    # EP 16 over two 8-GPU domains: X = 65536, P = 8 x 8, M (N - 1) = 4096 remote tokens
    combine = 65536 * 4096 * 2 + 65536 * 64 * 4 + 2 * (4096 * 4096 * 2 + 4096 * 64 * 4)
    dispatch = 4096 * 4096 * 2 + 4096 * 64 * 4 + 65536 * 4096 * 2 + 65536 * 64 * 4
    assert combine == 622_854_144 and dispatch == 588_251_136
    assert hybridep_buffer_bytes(H, M, E, 16, 8) == combine + dispatch
    # FP8 dispatch: 1-byte tokens and an fp32 scale per 128 values, combine unchanged
    fp8 = 4096 * 4096 + 4096 * 64 * 4 + 65536 * 4096 + 65536 * 64 * 4 + (65536 + 4096) * 32 * 4
    assert hybridep_buffer_bytes(H, M, E, 16, 8, fp8_dispatch=True) == combine + fp8 \
        == 934_805_504
