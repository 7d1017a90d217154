"""DeepEP's communication buffers (`[model] dispatch = "deepep"`): GPU memory every rank of an
expert-parallel group holds for the whole run, beside its activations.

DeepEP's README sizes its normal-mode `Buffer` as Megatron-Core's fused_a2a.get_buffer does:
the largest `get_nvl_buffer_size_hint` and `get_rdma_buffer_size_hint` (deepseek-ai/DeepEP
csrc/config.hpp) over `Buffer.get_dispatch_config(ep)` and `get_combine_config(ep)`
(deep_ep/buffer.py @04b06f7), with hidden_bytes = h · max(element size, 2) = 2h. With c =
num_sms / 2 channels (DeepEP's default 20 SMs), n = min(ep, 8) NVLink peers, r = ep / 8 RDMA
peers (1 inside a node), T the config's receive-buffer tokens (the RDMA ones rounded up to a
multiple of its send chunk), 128 top-k slots and 128 scales per token, an 8-byte source
meta:

    NVL   c·n·(4(2r + 3) + T·(2h + 8 + 128·8 + 128·4 + 128·4))                 aligned to 128
    RDMA  c·r·(8(2·8 + 2) + 2T·(2h + 8 + 128·8 + 128·4 + 128·4 + 16)) + 1 MiB aligned to 128,
          0 inside one node (ep <= 8)

An EP size DeepEP's table lacks takes the next size it lists (the largest above 160).
"""

from __future__ import annotations

from traces.layout import Layout
from traces.model import ModelSpec

NUM_SMS = 20
"""`Buffer.num_sms`, the SMs DeepEP's high-throughput kernels take (DeepSeek-V3 §3.2.2: 20)."""
NVL_PEERS = 8
"""DeepEP's NUM_MAX_NVL_PEERS: GPUs of a node on NVLink."""
MAX_TOPK = 128
MAX_SCALES = 128
SOURCE_META_BYTES = 8
"""internode::SourceMeta: the source RDMA rank and the NVLink-ranks bit mask, two ints."""
RDMA_SAFETY_BYTES = 1 << 20
"""The RDMA hint's "large number to be safe"."""

# EP size -> (NVL receive tokens, RDMA send tokens, RDMA receive tokens) of each config.
DISPATCH = {2: (256, 6, 128), 4: (256, 6, 128), 8: (256, 6, 128), 16: (288, 20, 128),
            24: (288, 32, 128), 32: (288, 32, 128), 64: (288, 28, 128), 128: (560, 32, 128),
            144: (720, 12, 128), 160: (720, 12, 128)}
COMBINE = {2: (256, 6, 128), 4: (256, 6, 128), 8: (256, 6, 128), 16: (288, 28, 128),
           24: (288, 20, 128), 32: (288, 20, 128), 64: (288, 20, 128), 128: (560, 12, 128),
           144: (720, 8, 128), 160: (720, 8, 128)}


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


def _per_token(hidden_bytes: int) -> int:
    """A buffered token: its hidden values, source meta, top-k indices (int64) and weights
    (fp32), and its scales (fp32)."""
    return hidden_bytes + SOURCE_META_BYTES + MAX_TOPK * 8 + MAX_TOPK * 4 + MAX_SCALES * 4


def nvl_bytes(recv_tokens: int, hidden_bytes: int, ranks: int) -> int:
    """`Config::get_nvl_buffer_size_hint`."""
    channels, nvl, rdma = NUM_SMS // 2, min(ranks, NVL_PEERS), max(ranks // NVL_PEERS, 1)
    total = channels * nvl * ((2 * rdma + 3) * 4 + recv_tokens * _per_token(hidden_bytes))
    return _align(total, 128)


def rdma_bytes(send_tokens: int, recv_tokens: int, hidden_bytes: int, ranks: int) -> int:
    """`Config::get_rdma_buffer_size_hint` (the receive tokens rounded up to a multiple of the
    send chunk, as Config's constructor does); 0 within one node."""
    if ranks <= NVL_PEERS:
        return 0
    channels, rdma = NUM_SMS // 2, ranks // NVL_PEERS
    tokens = _align(recv_tokens, send_tokens)
    total = channels * rdma * ((NVL_PEERS * 2 + 2) * 2 * 4
                               + 2 * tokens * (_per_token(hidden_bytes) + 16))
    return _align(total + RDMA_SAFETY_BYTES, 128)


def deepep_buffer_bytes(model: ModelSpec, layout: Layout) -> int:
    """The NVLink and RDMA buffers one GPU allocates (module docstring); 0 without experts
    across ranks or with another dispatch."""
    if model.dispatch != "deepep" or not model.experts or layout.ep == 1:
        return 0
    size = min((k for k in DISPATCH if k >= layout.ep), default=max(DISPATCH))
    hidden_bytes = 2 * model.hidden
    configs = (DISPATCH[size], COMBINE[size])
    nvl = max(nvl_bytes(recv, hidden_bytes, layout.ep) for recv, _, _ in configs)
    rdma = max(rdma_bytes(send, recv, hidden_bytes, layout.ep) for _, send, recv in configs)
    return nvl + rdma
