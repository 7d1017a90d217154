"""How an MoE layer's router, token permutation and expert GEMMs run: the device kernels of
each, with their HBM bytes, by the `[model]` keys Megatron-Core names them by.

    moe_router_fusion        true: one fused kernel for the score function, the top-k pick
                             and the probabilities (Transformer Engine's
                             fused_topk_with_score_function, Megatron-Core's
                             --moe-router-fusion); false: the aten ops of Megatron-Core's
                             moe_utils.topk_routing_with_score_function, and with
                             `capacity_factor` its token drop (`capacity_steps`)
    moe_router_score_function  "softmax" or "sigmoid" (DeepSeek-V3: sigmoid scores, top-k
                             weights normalized to sum to 1)
    moe_router_enable_expert_bias  aux-loss-free balancing (DeepSeek-V3 §2.1.2): a per-expert
                             bias b_e is added to the scores to pick the top-k, the weights are
                             the unbiased scores (Megatron-Core's --moe-router-enable-expert-bias)
    moe_permute_fusion       true: TE's fused moe_permute / moe_unpermute (one kernel each way,
                             a token row read once and written once per expert it goes to);
                             false: moe_utils.permute / unpermute's aten ops (index_select,
                             scatter_add, the routing map transposed and masked)
    moe_grouped_gemm         true: one grouped GEMM over the rank's local experts (Megatron-Core's
                             --moe-grouped-gemm, TEGroupedMLP); false: SequentialMLP, a GEMM
                             per expert, each its own launch and its own tile waves

Notation: T the rank's tokens, E experts, k top_k, h hidden, e the data dtype's bytes, A the
kept token assignments (T·k when dropless). An unfused step is one aten op: it reads its inputs
and writes its output once through HBM (as `traces.stack_eager` counts eager PyTorch); the fused
figures are `traces.moe`'s, unchanged. Where a step list has one entry the fused kernel runs
(its launch is the op's own); otherwise the op states its launches (`KernelWork.launches`,
charged one launch overhead each by `sim.models.compute`).
The expert bias's update once a step (Megatron-Core's _update_router_expert_bias: the
tokens each expert got, all-reduced, E floats) is too small to list.

The grouped GEMM's cost is the compute model's (`sim.models.compute`): the grouped kernel
splits every expert's M×N output into tiles, so an expert with M tokens pays ⌈M/tm⌉ tile rows
and its weights (N·K) are read whole whatever M is; a small M therefore runs far below peak
(tile quantization and the weights' bytes, the roofline). With grouped GEMM off each expert's
GEMM also fills the GPU's SMs alone (its own last wave) and pays its own launch.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

from traces.kernel_work import KernelWork, gemm_kernel, memory_kernel
from traces.model import ModelSpec
from traces.moe_groups import FORWARDING
from traces.purpose import Kernel

K = Kernel
FP32 = 4
INDEX_BYTES = 4  # int32 expert indices of the fused kernels
INT64 = 8  # torch.topk's and nonzero's indices
Step = tuple[str, float]
"""One device kernel: its aten op (or the fused kernel) and its HBM bytes."""
Steps = tuple[list[Step], list[Step]]
"""A plan kernel's device kernels, forward and backward."""


def router_steps(m: ModelSpec, tokens: int) -> Steps:
    """The score function, top-k and probabilities (module docstring): fused, one kernel each
    way; unfused, moe_utils' ops, and the scores over all experts the aux loss reads."""
    T, E, k, e = tokens, m.experts, m.top_k, m.dtype_bytes
    bias = E * FP32 if m.moe_router_enable_expert_bias else 0
    scores = T * E * FP32
    if m.moe_router_fusion:
        return ([("fused_topk", T * E * e + scores + T * k * (FP32 + INDEX_BYTES) + bias)],
                [("fused_topk_bwd", T * k * FP32 + scores + T * E * e)])
    pick = T * k * (e + INT64)  # topk's values and int64 indices
    if m.moe_router_score_function == "sigmoid":
        fwd: list[Step] = [("sigmoid", 2 * T * E * e)]
        if m.moe_router_enable_expert_bias:  # pick by s + b, weigh by s
            fwd += [("add", 2 * T * E * e + bias), ("topk", T * E * e + pick),
                    ("gather", T * k * (INT64 + e) + T * k * e)]
        else:
            fwd += [("topk", T * E * e + pick)]
        fwd += [("sum", T * k * e + T * e), ("div", 2 * T * k * e + T * e)]
        bwd: list[Step] = [("div_bwd", 3 * T * k * e + T * e), ("sum_bwd", T * e + T * k * e),
                           ("zeros", T * E * e), ("scatter", T * k * (INT64 + 2 * e)),
                           ("sigmoid_bwd", 3 * T * E * e)]
    else:  # softmax after the top-k (Megatron-Core's default, not pre-softmax)
        fwd = [("topk", T * E * e + pick), ("softmax", 2 * T * k * e)]
        bwd = [("softmax_bwd", 3 * T * k * e), ("zeros", T * E * e),
               ("scatter", T * k * (INT64 + 2 * e))]
    dense = [("zeros", T * E * e), ("scatter", T * k * (INT64 + 2 * e)),  # routing_probs
             ("zeros", T * E), ("scatter", T * k * (INT64 + 1))]  # routing_map
    drop, drop_bwd = capacity_steps(m, T)
    aux = ("scores_for_aux_loss", T * E * e + scores)
    return ([*fwd, *dense, *drop, aux],
            [("gather", T * E * e + T * k * (INT64 + e)), *bwd, *drop_bwd,
             ("scores_for_aux_loss_bwd", 2 * scores + T * E * e), ("add", 3 * T * E * e)])


def expert_capacity(m: ModelSpec, tokens: int) -> int:
    """Megatron-Core's get_capacity: ⌈T·k/E · c⌉ token slots an expert keeps, at most T."""
    return min(math.ceil(tokens * m.top_k / m.experts * m.capacity_factor), tokens)


def capacity_steps(m: ModelSpec, tokens: int) -> Steps:
    """Token drop in the unfused router (`capacity_factor` c > 0), as Megatron-Core's
    moe_utils.topk_softmax_with_capacity runs it (drop policy "probs", no padding): torch.topk
    over the tokens picks each expert's C = `expert_capacity` most probable (reads the T×E
    probabilities, writes E·C values and int64 indices), a mask of them (zeros, scatter of the
    E·C indices, .bool()), kept where routed (logical_and of two T×E masks) and the
    probabilities masked (mul); backward, the mul's. None when dropless."""
    if not m.capacity_factor:
        return [], []
    T, E, e = tokens, m.experts, m.dtype_bytes
    slots = E * expert_capacity(m, T)
    mul = 2 * T * E * e + T * E
    return ([("capacity_topk", T * E * e + slots * (e + INT64)), ("capacity_zeros", T * E * e),
             ("capacity_scatter", slots * (INT64 + e)), ("capacity_bool", T * E * e + T * E),
             ("logical_and", 3 * T * E), ("mul", mul)],
            [("mul_bwd", mul)])


def permute_steps(m: ModelSpec, tokens: int, kept: int) -> Steps:
    """Tokens into expert order, one row per kept assignment: fused, TE's moe_permute (reads
    each token and the routing map, writes A rows); unfused, the map transposed, the token
    indices selected by it and index_select's A rows (read A·h·e, write A·h·e)."""
    T, E, h, e, A = tokens, m.experts, m.hidden, m.dtype_bytes, kept
    if m.moe_permute_fusion:
        return ([("moe_permute", T * h * e + T * E + A * h * e)],
                [("moe_permute_bwd", (A + T) * h * e)])
    return ([("transpose", 2 * T * E), ("masked_select", T * E + A * INT64),
             ("index_select", A * INT64 + 2 * A * h * e)],
            [("zeros", T * h * e), ("index_add", A * INT64 + 3 * A * h * e)])


def unpermute_steps(m: ModelSpec, tokens: int, kept: int) -> Steps:
    """The experts' rows weighted by their probabilities back into token order: fused, TE's
    moe_unpermute; unfused, the probabilities selected in expert order, a multiply and a
    scatter_add (read A rows, add them into T rows) onto zeros."""
    T, E, h, e, A = tokens, m.experts, m.hidden, m.dtype_bytes, kept
    if m.moe_probs_in_activation:  # weighed in the experts (`traces.moe_probs`): no probs
        return _unweighted_unpermute(m, T, A)
    if m.moe_permute_fusion:
        return ([("moe_unpermute", A * (h * e + FP32) + T * h * e)],
                [("moe_unpermute_bwd", T * h * e + A * h * e + A * (h * e + FP32))])
    rows = A * h * e
    return ([("transpose", 2 * T * E * e), ("masked_select", T * E * (e + 1) + A * e),
             ("mul", 2 * rows + A * e), ("zeros", T * h * e),
             ("scatter_add", A * INT64 + 3 * rows)],
            [("gather", A * INT64 + 2 * rows), ("mul", 2 * rows + A * e),
             ("mul_sum", 2 * rows + A * e), ("zeros", T * E * e),
             ("masked_scatter", A * e + T * E * (e + 1)), ("transpose", 2 * T * E * e)])


def _unweighted_unpermute(m: ModelSpec, T: int, A: int) -> Steps:
    """The unpermute without probabilities: fused, read A rows and write T (backward: read T
    rows of dY, write A); unfused, scatter_add onto zeros (backward: a gather)."""
    h, e = m.hidden, m.dtype_bytes
    rows = A * h * e
    if m.moe_permute_fusion:
        return ([("moe_unpermute", rows + T * h * e)], [("moe_unpermute_bwd", T * h * e + rows)])
    return ([("zeros", T * h * e), ("scatter_add", A * INT64 + 3 * rows)],
            [("gather", A * INT64 + 2 * rows)])


def chunk_sort_rows(m: ModelSpec, local: tuple[int, ...]) -> int:
    """Rows the all-to-all dispatcher re-sorts by local expert after the dispatch (and back
    before the combine): all R = Σ local received rows where the rank holds more than one
    expert, else 0. Megatron-Core's MoEAlltoAllTokenDispatcher receives its tokens ordered by
    source rank, then expert, and runs "Permutation 2: Sort tokens by local expert"
    (`sort_chunks_by_idxs` over the EP·ETP x local-expert chunks, after the ETP all-gather)
    whenever `num_local_experts > 1`, and "Unpermutation 2" in `combine_preprocess` (NVIDIA/
    Megatron-LM megatron/core/transformer/moe/token_dispatcher.py, stored at commit 0014f137;
    the same `if self.num_local_experts > 1:` in the 2024-25 releases). The DeepEP and
    HybridEP dispatchers (`traces.moe_groups.FORWARDING`) hand tokens to their own permute
    instead: 0."""
    if m.dispatch in FORWARDING or len(local) <= 1:
        return 0
    return sum(local)


def chunk_sort_steps(m: ModelSpec, rows: int, probs: bool) -> Steps:
    """The sort of `rows` received rows into local-expert order (`chunk_sort_rows`), or with
    `probs` false its inverse before the combine: one copy of every row each way. Fused
    (`moe_permute_fusion`), Transformer Engine's fused_sort_chunks_by_index reads each row once
    and writes it once; unfused, moe_utils.sort_chunks_by_idxs is torch.split (views) and
    torch.cat (one kernel: read and write every row), whose backward is the split's, one cat
    of the gradient's chunks back. Where the experts weigh the rows by their probabilities
    (`moe_probs_in_activation`) the dispatch-side sort carries the R fp32 probabilities too
    (fused_sort_chunks_by_index_with_probs), and its backward their gradients. Nothing
    without rows."""
    if not rows:
        return [], []
    copy = 2 * rows * m.hidden * m.dtype_bytes
    if probs and m.moe_probs_in_activation:
        copy += 2 * rows * FP32
    name = "sort_chunks_by_index" if probs else "unsort_chunks_by_index"
    return [(name, copy)], [(name + "_bwd", copy)]


def joined(*steps: Steps) -> Steps:
    """Several kernels' steps as one plan kernel's (forward and backward each in order)."""
    return ([s for fwd, _ in steps for s in fwd], [s for _, bwd in steps for s in bwd])


def stepped(name: Kernel, steps: Steps) -> KernelWork:
    """One plan kernel of `steps`: their bytes, and their launches where there are several."""
    fwd, bwd = steps
    work = memory_kernel(name, float(sum(b for _, b in fwd)), float(sum(b for _, b in bwd)))
    if len(fwd) == 1 and len(bwd) == 1:
        return work
    return dataclasses.replace(work, launches=(len(fwd), len(bwd)))


def expert_gemms(name: Kernel, local: tuple[int, ...], n: int, k: int, model: ModelSpec,
                 grad_bytes: int) -> list[KernelWork]:
    """The local experts' GEMMs (M_e, n, k) for M_e = `local`[e] tokens: grouped, one
    (experts, M, n, k) op per distinct M > 0, largest M first (one grouped kernel when the
    counts are equal, as under balanced routing); else one (1, M_e, n, k) op per expert with
    tokens, in the experts' order (SequentialMLP)."""
    if model.moe_grouped_gemm:
        shapes = [(experts, m) for m, experts in
                  sorted(Counter(c for c in local if c).items(), reverse=True)]
    else:
        shapes = [(1, m) for m in local if m]
    out = []
    for experts, m in shapes:
        work = gemm_kernel(name, (experts, m, n, k), model.dtype_bytes, grad_bytes)
        out.append(dataclasses.replace(work, fp8=model.fp8, fp4=model.fp4))
    return out


def moe_launch_counts(model: ModelSpec) -> dict[tuple[str, bool], int]:
    """Device kernels per (kernel, backward) of the MoE kernels that run as several aten ops
    (unfused router or permutation); none with the fused kernels. Counts depend on no size."""
    if not model.experts:
        return {}
    works = [stepped(K.TOPK, router_steps(model, 1)),
             stepped(K.PERMUTE, permute_steps(model, 1, 1)),
             stepped(K.UNPERMUTE, unpermute_steps(model, 1, 1))]
    return {(str(w.name), backward): w.launches[backward]
            for w in works if w.launches is not None for backward in (False, True)}
