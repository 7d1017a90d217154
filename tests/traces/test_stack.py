"""`[model] kernels`: the kernels each software stack launches for a block (`traces.stack`),
with their bytes, the FLOPs the same in every stack, and the default's plans unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from sim.simulate import model_summary
from traces.errors import ConfigError
from traces.header import TraceMeta
from traces.header_json import meta_to_json
from traces.kernels import layer_kernels
from traces.model import ModelSpec
from traces.purpose import Kernel
from traces.stack import launch_counts, restack

K = Kernel
LLAMA = ModelSpec(layers=2, hidden=4096, heads=32, kv_heads=8, seq_len=2048, vocab=128256,
                  ffn="swiglu", ffn_hidden=14336, norm="rmsnorm", position="rope", bias=False,
                  dropout=0.0)
"""A Llama 3 8B block (GQA 32/8, SwiGLU 14336, RMSNorm, RoPE, no biases, no dropout)."""
ORDER = (K.LN1, K.QKV, K.ROPE, K.FLASH_ATTN, K.PROJ, K.BDA1, K.LN2, K.FC1, K.SWIGLU, K.FC2,
         K.BDA2)
# (forward, backward) launches per kernel in ORDER: the fused stack's one each (a GEMM's
# backward two); eager PyTorch's aten ops (traces.stack_eager: RMSNorm 6 and 14 + the
# residual's gradient sum, RoPE 6 and 6, GQA's two repeats + sdpa and sdpa's backward, two
# sums, two copies and the dqkv concatenation, SwiGLU 2 and 4, an add and nothing; autograd's
# adds of wq/wk/wv's three and w1/w3's two input gradients before ln1's and ln2's backward,
# traces.stack.input_grad_sum); inductor's
# one per fused chain (ln2 inside bda1's kernel, no kernel for the adds' backward)
LAUNCHES = {
    "fused": [(1, 1), (1, 2), (1, 1), (1, 1), (1, 2), (1, 1), (1, 1), (1, 2), (1, 1), (1, 2),
              (1, 1)],
    "eager": [(6, 17), (1, 2), (6, 6), (3, 6), (1, 2), (1, 0), (6, 16), (1, 2), (2, 4), (1, 2),
              (1, 0)],
    "compiled": [(1, 1), (1, 2), (1, 1), (3, 6), (1, 2), (1, 0), (0, 1), (1, 2), (1, 1), (1, 2),
                 (1, 0)],
}
TOTALS = {"fused": 26, "compiled": 30, "eager": 86}


def block(kernels: str, b: int = 1, t: int = 1, sp: bool = False, model: ModelSpec = LLAMA):
    m = dataclasses.replace(model, kernels=kernels)
    return m, restack(m, layer_kernels(m, b, t, sp), b, t, sp)


def launches(model: ModelSpec, works) -> list[tuple[int, int]]:
    counts = launch_counts(model) or {}
    return [(counts.get((str(w.name), False), 1),
             counts.get((str(w.name), True), 2 if w.gemm else 1)) for w in works]


@pytest.mark.parametrize("stack", sorted(LAUNCHES))
def test_each_stack_launches_its_kernels_for_a_llama_block(stack):
    model, works = block(stack)
    assert [w.name for w in works] == list(ORDER)  # every stack runs the plan's ops
    got = launches(model, works)
    assert got == LAUNCHES[stack]
    assert sum(f + b for f, b in got) == TOTALS[stack]


def test_eager_moves_more_bytes_than_compiled_than_fused_at_the_same_flops():
    moved, flops = {}, {}
    for stack in LAUNCHES:
        _, works = block(stack)
        moved[stack] = sum(w.mem_bytes + w.bwd_bytes for w in works)
        flops[stack] = [(w.flops, w.bwd_flops, w.gemm) for w in works]
    assert flops["eager"] == flops["compiled"] == flops["fused"]
    assert moved["eager"] > moved["compiled"] > moved["fused"]
    assert TOTALS["eager"] > TOTALS["compiled"] > TOTALS["fused"]


def test_the_eager_rmsnorm_bytes_are_its_ops_round_trips():
    _, fused = block("fused")
    _, works = block("eager", b=2, t=4, sp=True)
    ln1 = works[0]
    n, q, e = 2 * 2048 // 4 * 4096, 2 * 2048 // 4, 2  # SP: the rank's s/t tokens
    assert ln1.mem_bytes == (7 * n + 6 * q) * e  # pow, mean, add, rsqrt, mul, mul
    assert ln1.bwd_bytes == (23 * n + 10 * q + 3 * n) * e  # autograd's 14 + the residual add
    assert fused[0].mem_bytes == 2 * 2048 * 4096 * e  # fused: read x, write y


def test_the_eager_grouped_attention_reads_its_repeated_keys_and_values():
    _, fused = block("fused")
    _, works = block("eager")
    core, d, s, e = works[3], 128, 2048, 2
    qd, kd = 32 * s * d, 8 * s * d
    assert core.mem_bytes == 2 * (kd + qd) * e + 4 * qd * e + 4 * 32 * s
    assert core.flops == fused[3].flops  # sdpa's FLOPs are flash's


def test_compiled_ln2_is_written_by_bda1s_kernel():
    _, works = block("compiled")
    n, e = 2048 * 4096, 2
    # its backward also reads w3's input gradient, the sum with w1's fused in
    assert works[6].mem_bytes == n * e and works[6].bwd_bytes == (4 + 1) * n * e
    assert works[5].bwd_bytes == 0 and works[10].bwd_bytes == 0  # autograd's add: no kernel


def test_the_default_stack_is_todays_and_leaves_the_header_as_it_was():
    fused = layer_kernels(LLAMA, 1, 1, False)
    assert restack(LLAMA, fused, 1, 1, False) is fused and launch_counts(LLAMA) is None
    assert "kernels" not in meta_to_json(TraceMeta(model=LLAMA))["model"]
    eager = dataclasses.replace(LLAMA, kernels="eager")
    assert meta_to_json(TraceMeta(model=eager))["model"]["kernels"] == "eager"


def test_a_stack_outside_the_three_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^model.kernels: 'jit' is not one of fused, "
                                          r"compiled, eager$"):
        dataclasses.replace(LLAMA, kernels="jit")



def test_compiled_runs_the_final_norm_eager_outside_the_compiled_blocks():
    counts = launch_counts(dataclasses.replace(LLAMA, kernels="compiled"))
    assert counts is not None
    assert (counts[("final_ln", False)], counts[("final_ln", True)]) == (6, 14)  # no residual
    assert (counts[("ln1", False)], counts[("ln1", True)]) == (1, 1)


def test_the_summary_names_a_torch_stack_and_leaves_the_fused_one_unsaid():
    assert model_summary(LLAMA).endswith(", bf16")
    assert model_summary(dataclasses.replace(LLAMA, kernels="eager")).endswith(
        ", bf16, PyTorch eager kernels")
    assert model_summary(dataclasses.replace(LLAMA, kernels="compiled")).endswith(
        ", bf16, torch.compile kernels")
