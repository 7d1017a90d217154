"""The software stack as an input: `[model] kernels = "fused" | "compiled" | "eager"`, the
device kernels each stack launches for a transformer block's memory-bound kernels, with the
HBM bytes of each.

fused     Megatron-Core with Transformer Engine (`traces.kernels`): one fused kernel per plan
          kernel and phase (RMSNorm/LayerNorm, fused RoPE, flash attention on grouped K/V,
          fused SwiGLU or bias-GeLU, fused bias-dropout-add). The default: plans are as before.
eager     eager PyTorch, as the executor and torchtitan without torch.compile run a block: one
          kernel per aten op, each a round trip through HBM (`traces.stack_eager` lists them,
          forward and autograd's backward).
compiled  torch.compile (inductor, torchtitan compiles each block): each chain of pointwise
          ops and reductions between two GEMMs is one generated kernel. A norm is one kernel
          (its backward one, with the residual's gradient sum fused in: read x, dy and the
          residual's gradient, write dx: 4n); the residual add before ln2 and ln2 are one
          kernel, so ln2 writes its output without reading the sum back (its launch is bda1's);
          RoPE is one kernel over the [q | k | v] tensor; SwiGLU's silu·mul and GeLU one each,
          as fused; bias-dropout-add one (none in backward without bias and dropout, as in
          eager); sdpa stays an external kernel fed by eager's grouped-query copies, and the
          final norm, outside the blocks torchtitan compiles (apply_compile wraps each
          TransformerBlock), runs eager.

The GEMMs and their FLOPs are the same in every stack, but the DTensor stacks (eager, compiled:
torchtitan's Llama) run qkv as separate wq, wk, wv GEMMs and SwiGLU's fc1 as w1, w3
(`gemm_splits`), each re-reading the shared input, with their input gradients summed in
backward (`input_grad_sum`); the compute model costs each part by its own shape
(`sim.models.compute`).

Each plan op keeps its kernel (`traces.purpose.Kernel`) in every stack: the executor runs the
same ops, and a restacked kernel states its launches (`KernelWork.launches`), which the compute
model charges one launch overhead each (`launch_counts`, `sim.models.compute`). A kernel a
stack does not change (a GEMM, latent attention's, MoE's, FP8's) keeps the fused figures.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from traces import stack_eager as eager
from traces.fp8 import recipe as fp8_recipe
from traces.kernel_work import KernelWork
from traces.kernels import head_kernels, layer_kernels
from traces.model import ModelSpec
from traces.moe_steps import moe_launch_counts
from traces.purpose import Kernel

K = Kernel
NORMS = {K.LN1: True, K.LN2: True, K.FINAL_LN: False}
"""The norms, and whether their input is also the residual."""
SUMMED = {K.LN1: K.QKV, K.LN2: K.FC1}
"""The norm whose output gradient is the sum of a split GEMM's input gradients
(`input_grad_sum`): in the norm's backward unless SP's reduce-scatter's shard copy sums them
first (`traces.plan.tensor`)."""


def restack(model: ModelSpec, works: list[KernelWork], b: int, t: int, sp: bool
            ) -> list[KernelWork]:
    """`works` (one micro-batch's kernels on one TP rank) as the model's stack runs them."""
    if model.kernels == "fused":
        return works
    names = {work.name for work in works}
    out = []
    for work in works:
        lists = stack_lists(model, work, b, t, sp)
        fed = SUMMED.get(work.name)
        if lists is not None and fed in names and not (sp and t > 1):
            n_bytes = b * model.seq_len * model.hidden * model.dtype_bytes  # never sharded
            lists = lists[0], (*input_grad_sum(model, fed, n_bytes)[1], *lists[1])
        out.append(work if lists is None else _with(work, lists))
    return out


def stack_lists(model: ModelSpec, work: KernelWork, b: int, t: int, sp: bool
                ) -> eager.Lists | None:
    """The launches (aten op, bytes) of `work` in the model's stack, forward and backward;
    None where the stack runs the fused kernel's figures."""
    if model.kernels == "eager":
        return _eager(model, work, b, t, sp)
    if model.kernels == "compiled":
        return _compiled(model, work, b, t, sp)
    return None


@dataclass(frozen=True, slots=True)
class GemmSplit:
    """A plan GEMM that a DTensor stack runs as several GEMMs on one input (`gemm_splits`):
    each reads the whole input A again, and in backward writes an input gradient of A's size
    and reads A again for its weight gradient; the compute model costs each part as its own
    GEMM, by its shape and bytes (`sim.models.compute.ComputeModel.kernel_time`)."""

    widths: tuple[int, ...]
    """The parts' output widths before TP (wq, wk, wv: a·d, g·d, g·d; w1, w3: f, f): each
    part's share of the plan GEMM's N."""
    input_bytes: float
    """Bytes per element of A as each part's forward and weight-gradient GEMM read it (FP8's
    q_a for a quantized model, else the model's dtype)."""
    grad_bytes: float
    """Bytes per element of the input gradient each part's dgrad writes (the model's dtype)."""

    def extra_bytes(self, share: float, a_elements: float, backward: bool | str) -> float:
        """HBM bytes a part with `share` of N moves beyond its share of the plan GEMM's:
        the rest (1 - share) of A's elements read again forward, and in backward written
        (dgrad) and read again (wgrad). Summed over the parts: (parts - 1) x A."""
        per = self.input_bytes if backward is False else \
            self.grad_bytes if backward == "dgrad" else \
            self.input_bytes if backward == "wgrad" else self.grad_bytes + self.input_bytes
        return (1.0 - share) * a_elements * per


def gemm_splits(model: ModelSpec) -> dict[str, GemmSplit]:
    """The plan GEMMs a DTensor stack (`kernels` "eager" or "compiled", torchtitan) runs as
    separate GEMMs: torchtitan's Llama has separate wq, wk, wv and w1, w3 nn.Linear modules,
    `xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)` and `self.w2(F.silu(self.w1(x)) *
    self.w3(x))` (pytorch/torchtitan torchtitan/models/llama/model.py @0199cbc), each its own
    ColwiseParallel linear under TP (infra/parallelize.py @018740b, apply_tp), so each its own
    GEMM: torch.compile does not merge matmuls that share an input (Inductor's
    micro_pipeline_tp pass groups them only around an all-gather, `fuse_all_gather_matmul`:
    `C_0 = A @ B_0, C_1 = A @ B_1, ...` into one fused_all_gather_matmul(A_shard, [B_0, B_1,
    ...]), which still runs one mm per B on each gathered chunk; pytorch/pytorch
    torch/_inductor/fx_passes/micro_pipeline_tp.py @00122fb, and
    torch/distributed/_symmetric_memory/__init__.py @006b161, _fused_all_gather_matmul_impl:
    each shard consumer loops `for B in Bs: mm_out_op(shard, B, ...)`; neither is the tables'
    exact torch 1963fc8, which the corpus does not hold). Megatron-Core (the fused stack) fuses
    them into linear_qkv and linear_fc1: none. Latent attention keeps its own kernels."""
    if model.kernels == "fused" or model.mla:
        return {}
    e = model.dtype_bytes
    a = fp8_recipe(model).q_act if model.fp8 else e
    out = {str(K.QKV): GemmSplit((model.q_width, model.kv_width, model.kv_width), a, e)}
    if model.ffn == "swiglu":
        out[str(K.FC1)] = GemmSplit((model.ffn_hidden, model.ffn_hidden), a, e)
    return out


def input_grad_sum(model: ModelSpec, kernel: Kernel, n_bytes: float) -> eager.Lists:
    """The launches that sum a split GEMM's (`gemm_splits`) p input gradients of `n_bytes`
    each into one, in backward: autograd's engine adds each further gradient of a tensor used
    by several ops to the buffered one (InputBuffer::accumulate: one add, read 2, write 1,
    p - 1 times) in eager PyTorch; under torch.compile the adds are pointwise nodes Inductor
    fuses into the kernel that next reads the sum (DTensor's chunk + cat before the SP
    reduce-scatter, `traces.plan.tensor`; the norm's backward without SP): that kernel reads
    p - 1 gradients more, no launch of its own (op ""). None where the GEMM is not split."""
    split = gemm_splits(model).get(str(kernel))
    extra = len(split.widths) - 1 if split else 0
    if model.kernels == "compiled":
        return (), (("", extra * n_bytes),) if extra else ()
    return (), tuple(("add", 3 * n_bytes) for _ in range(extra))


def regathers(model: ModelSpec) -> bool:
    """Whether a sequence-parallel column-parallel GEMM (qkv, fc1, logits; latent attention's
    up-projections) keeps only its input's sequence shard and all-gathers it again in backward
    for the weight gradient (True: "fused", Megatron-Core / Transformer Engine), or keeps the
    gathered input itself, so that backward gathers nothing (False: torch's DTensor, which
    torchtitan's eager and compiled stacks run).

    Megatron-Core: LinearWithGradAccumulationAndAsyncCommunication saves `input` (the shard)
    and its backward all-gathers it when sequence_parallel (megatron/core/tensor_parallel/
    layers.py @000c4ac); Transformer Engine likewise (module/linear.py @3ec8787:
    ctx.backward_input_needs_gather = ... parallel_mode == "column" and sequence_parallel).
    torchtitan (torchtitan/models/llama3/infra/parallelize.py @018740b, apply_tp): norms
    SequenceParallel, PrepareModuleInput(Shard(1) -> Replicate()) before attention and
    feed_forward, wq/wk/wv/w1/w3 ColwiseParallel, output ColwiseParallel(input_layouts=
    Shard(1)); DTensor's Redistribute saves no tensor and its backward redistributes the
    gradient to the input's placement, Partial -> Shard(1), a reduce-scatter
    (torch/distributed/tensor/_redistribute.py @012e4b9), while the mm autograd node saves
    its input, the gathered tensor. So the stack decides it: no key of its own."""
    return model.kernels == "fused"


def launch_counts(model: ModelSpec) -> dict[tuple[str, bool], int] | None:
    """Device kernels per (kernel, backward) where the model's stack states them; None for the
    fused stack (each op's own one launch, a GEMM's backward two). Counts do not depend on the
    batch, TP or SP, so one small layer gives them."""
    moe = moe_launch_counts(model)  # an unfused router or permutation (`traces.moe_steps`)
    if model.kernels == "fused":
        return moe or None
    works = restack(model, layer_kernels(model, 1, 1, False) + head_kernels(model, 1, 1, False),
                    1, 1, False)
    return {**{(str(w.name), backward): w.launches[backward]
               for w in works if w.launches is not None for backward in (False, True)}, **moe}


def _with(work: KernelWork, lists: eager.Lists) -> KernelWork:
    """`work` with the stack's bytes and launches (an op named "" moves bytes inside a kernel
    another op launches: compiled ln2's output, written by bda1's kernel)."""
    fwd, bwd = lists
    return dataclasses.replace(work, mem_bytes=float(sum(x for _, x in fwd)),
                               bwd_bytes=float(sum(x for _, x in bwd)),
                               launches=(sum(1 for op, _ in fwd if op),
                                         sum(1 for op, _ in bwd if op)))


def _eager(model: ModelSpec, w: KernelWork, b: int, t: int, sp: bool) -> eager.Lists | None:
    s, h, e = model.seq_len, model.hidden, model.dtype_bytes
    tokens = b * (s // t if sp else s)
    n = tokens * h
    name = w.name
    if name in NORMS:
        if model.norm == "rmsnorm":
            return eager.rmsnorm(n, tokens, e, NORMS[name])
        return eager.layernorm(n, e, NORMS[name])
    if name is K.ROPE and not model.mla:
        d = model.head_dim
        m = b * s * (model.heads + model.kv_heads) // t * d
        return eager.rope(m, b * s * model.kv_heads // t * d, s * d, e)
    if name is K.FLASH_ATTN and not model.mla:
        return eager.flash(model, b * model.heads // t, b * model.kv_heads // t, s,
                           (w.mem_bytes, w.bwd_bytes))
    big_n = b * s * model.ffn_hidden / t
    if name is K.SWIGLU:
        return eager.swiglu(big_n, e)
    if name is K.GELU:
        return eager.gelu(big_n, e)
    if name in (K.BDA1, K.BDA2):
        return eager.bda(n, e, model.bias, model.dropout > 0)
    scores = b * model.heads // t * s * s
    if name is K.SOFTMAX and not model.mla:
        return eager.softmax(scores, e)
    if name is K.ATTN_DROPOUT:
        return eager.dropout(scores, e)
    return None


def _compiled(model: ModelSpec, w: KernelWork, b: int, t: int, sp: bool
              ) -> eager.Lists | None:
    e = model.dtype_bytes
    n = b * (model.seq_len // t if sp else model.seq_len) * model.hidden
    name = w.name
    if name is K.FINAL_LN or name is K.FLASH_ATTN and not model.mla:
        return _eager(model, w, b, t, sp)  # outside the compiled blocks; sdpa is external
    if name in NORMS:
        bwd = (("norm_backward", (4 if NORMS[name] else 3) * n * e),)
        if name is K.LN2:  # in bda1's kernel: writes its output, reads nothing back
            return (("", n * e),), bwd
        return (("norm", w.mem_bytes),), bwd
    if name is K.ROPE and not model.mla:
        s, d = model.seq_len, model.head_dim
        qkv = b * s * (model.heads + 2 * model.kv_heads) // t * d
        both = (2 * qkv + 2 * s * d) * e
        return (("rope", both),), (("rope_backward", both),)
    if name in (K.BDA1, K.BDA2):
        idle = not model.bias and not model.dropout
        return (("bda", w.mem_bytes),), () if idle else (("bda_backward", w.bwd_bytes),)
    return None
