"""torchao's tensorwise Float8Linear (the eager and compiled stacks) casts each weight at every
forward, a recomputed one too, and never once a step (`Fp8Recipe.weight_per_forward`);
Transformer Engine's current scaling (the fused stack) casts once a step."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from traces.fp8 import fp8_linear, recipe, weight_cast_bytes
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Phase
from traces.plan import build
from traces.purpose import Kernel, KernelRun

K = Kernel
LLAMA = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, seq_len=32, vocab=128,
                  ffn="swiglu", ffn_hidden=96, norm="rmsnorm", position="rope", bias=False,
                  tied_embeddings=False, dtype="fp8", fp8_recipe="tensorwise")
TE = LLAMA
TORCHAO = dataclasses.replace(LLAMA, kernels="compiled")


@pytest.mark.parametrize("shard", [1, 2])
def test_torchao_casts_the_weight_before_each_forward_gemm(shard: int) -> None:
    """fc1 at (1, 64, 64, 32): X's amax (2a) and cast (read 2a, write the row-wise copy and
    its transpose, 4a; with SP over the rank's shard, row-wise only, 3a/t), then W's amax
    (read 2w) and cast (read 2w, write w), all forward."""
    m, n, k = 64, 64, 32
    works = fp8_linear(TORCHAO, K.FC1, (1, m, n, k), 2, shard=shard)
    casts = [(w.name, w.mem_bytes) for w in works if not w.gemm and w.mem_bytes]
    a, w = m * k / shard, k * n
    assert casts == [(K.FP8_AMAX, 2 * a), (K.FP8_CAST, (3 if shard > 1 else 4) * a),
                     (K.FP8_AMAX, 2 * w),
                     (K.FP8_CAST, 3 * w)]
    te = [(x.name, x.mem_bytes) for x in fp8_linear(TE, K.FC1, (1, m, n, k), 2, shard=shard)
          if not x.gemm and x.mem_bytes]
    assert te == casts[:2]
    assert recipe(TORCHAO).weight_per_forward and not recipe(TE).weight_per_forward


def test_torchao_has_no_step_weight_cast() -> None:
    assert weight_cast_bytes(TORCHAO, range(2), 1) == 0
    assert weight_cast_bytes(TE, range(2), 1) > 0


def test_full_recomputation_casts_the_weights_again() -> None:
    """Per micro-batch and layer, 4 plan GEMMs: 4 weight amaxes forward and 4 again when
    the forward is recomputed; TE none (its step cast runs after the optimizer)."""
    layout = Layout(global_batch=2, micro_batch=1, recompute="full")

    def amaxes(model: ModelSpec) -> Counter:
        return Counter(op.phase for op in build(model, layout).ops[0]
                       if op.purpose == KernelRun(K.FP8_AMAX) and op.phase is not Phase.BWD)
    te, ao = amaxes(TE), amaxes(TORCHAO)
    micro, layers = 2, 2
    assert ao[Phase.FWD] - te[Phase.FWD] == micro * layers * 4
    assert ao[Phase.RECOMPUTE] - te[Phase.RECOMPUTE] == micro * layers * 4
