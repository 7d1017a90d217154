"""An MoE layer's kernels for one micro-batch on one rank: FLOPs and HBM bytes.

An MoE layer (`traces.moe_spec.is_moe_layer`) is the dense layer's attention and ln2, then, in
place of fc1, the activation and fc2 (Megatron-Core's MoELayer, all-to-all token dispatcher):

    router      logits of T tokens over E experts: GEMM (1, T, E, h)
    topk        softmax and top-k: fwd read T·E·e logits, write T·E·4 scores and T·k·8 probs
                and indices; bwd read T·k·4 dprobs and the scores, write T·E·e dlogits
    aux_loss    the load-balancing loss Σ_e f_e·P_e: fwd read the T·E·4 scores, bwd write
                their gradient T·E·4
    permute     fwd read T·h·e tokens and the T·E·1 routing map, write A·h·e (one row per
                kept assignment, A = Σ_e counts[e]); bwd read A·h·e, write T·h·e
    [dispatch all-to-all over the EP group; with ETP > 1 an all-gather over the ETP group]
    sort        with more than one local expert, the R received rows re-sorted from (source
                rank, expert) into expert order: read and write R·h·e each way
                (`traces.moe_steps.chunk_sort_steps`); charged on the permute's op (its own
                device kernel, after the all-to-all in Megatron-Core: on a compute stream that
                blocks on the all-to-all the same time, before it rather than after)
    expert_fc1  grouped GEMMs (n, M, f1/etp, h), one op per distinct M: the n local experts
                that got M = EP·ETP·counts[e] tokens each (tile and wave quantization then
                follow the tokens per expert: few tokens run far from peak)
    expert_act  the activation over R·f/etp values, R = Σ_local M (as `mlp_activation`)
    expert_fc2  grouped GEMMs (n, M, h, f/etp)
    unsort      the inverse sort before the combine, R·h·e read and written each way (charged
                on the unpermute's op, as the sort on the permute's)
    [with ETP > 1 a reduce-scatter; the combine all-to-all]
    unpermute   fwd read A·h·e and A·4 probs, write T·h·e; bwd read T·h·e dY and A·h·e,
                write A·h·e and A·4 dprobs; with `moe_probs_in_activation` the activation
                weighs the rows instead (`traces.moe_probs`) and the probs' bytes go there
    fc1, act, fc2 of the shared experts: a dense MLP of width S·moe_ffn_hidden split by TP
                (Megatron's SharedExpertMLP, with the dense MLP's SP collectives); none if S = 0

T is the rank's tokens, b·s/t (MoE with TP runs with SP), counts are `expert_counts(model,
layer, T)`. The router GEMM's 2·T·h·E FLOPs are real work but not model FLOPs (Megatron-LM's
num_floating_point_operations leaves them out); dropped tokens do no expert work. FP8 runs the
expert GEMMs at the FP8 rate, each after `expert_cast`, its R rows' input quantized, and before
its backward `expert_cast_grad`, its output gradient's (the recipe's casts,
`traces.fp8_recipes.input_casts` / `backward_casts` over the R·K input and R·N gradient
elements): Transformer Engine's GroupedLinear quantizes every expert's slice of both
(`tex.split_quantize`; one kernel per expert but for delayed scaling, `sim.models.host`). The
figures above are the fused
kernels' and the grouped GEMM's, the defaults; `traces.moe_steps` has the unfused router and
permutation, sigmoid scores with an expert bias, and a GEMM per expert.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from traces.expert_grid import ep_coord
from traces.fp8 import recipe
from traces.fp8_recipes import backward_casts, input_casts
from traces.kernel_work import KernelWork, gemm_kernel, memory_kernel
from traces.kernels import layer_kernels
from traces.layout import Layout
from traces.model import ModelSpec
from traces.moe_probs import activation_prob_bytes
from traces.moe_spec import expert_counts, is_moe_layer
from traces.moe_steps import (
    chunk_sort_rows,
    chunk_sort_steps,
    expert_gemms,
    joined,
    permute_steps,
    router_steps,
    stepped,
    unpermute_steps,
)
from traces.purpose import Kernel

K = Kernel
FP32 = 4


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExpertShard:
    """Where a rank sits in the expert grid (`traces.expert_grid`)."""

    ep: int = 1
    etp: int = 1
    ep_rank: int = 0


def skewed_experts(m: ModelSpec, layout: Layout) -> bool:
    """Skewed routing over EP > 1: the EP ranks of a stage run different expert work."""
    return m.experts > 0 and m.routing_skew > 0 and not m.force_balance and layout.ep > 1


@lru_cache(maxsize=64)
def uneven_experts(m: ModelSpec, layout: Layout) -> bool:
    """Balanced routing whose T·k routed tokens do not split evenly over the experts
    (`traces.moe_spec.expert_counts` gives the first T·k mod E experts one more), so EP ranks
    hold different token counts (and grouped GEMMs): rank programs differ by EP coordinate as
    under skew, and the uniform fold may not stand for them. Cached: `expert_loads` asks once
    per rank."""
    if m.experts == 0 or layout.ep == 1 or skewed_experts(m, layout):
        return False
    tokens = layout.micro_batch * (m.seq_len // layout.cp) // layout.tp
    layer = next((i for i in range(m.layers) if is_moe_layer(m, i)), None)
    if layer is None:
        return False
    loads = {tuple(sorted(local_expert_tokens(m, layer, tokens, ExpertShard(
        ep=layout.ep, etp=layout.etp, ep_rank=r)))) for r in range(layout.ep)}
    return len(loads) > 1


def distinct_experts(m: ModelSpec, layout: Layout) -> bool:
    """EP ranks of one stage run different expert work: skewed or unevenly split routing."""
    return skewed_experts(m, layout) or uneven_experts(m, layout)


def expert_loads(model: ModelSpec, layout: Layout, rank: int) -> tuple[tuple[int, ...], ...]:
    """What sets an EP rank's program apart under skewed or unevenly split routing
    (`distinct_experts`, `traces.identity`): for each
    MoE layer of its pipeline rank (chunk by chunk), the tokens its experts process, sorted.
    Its grouped GEMMs (one per distinct count) and expert activation follow from that multiset,
    and nothing else in its program depends on its EP coordinate: the all-to-alls move the same
    A·h·e bytes on every rank. () where every EP rank's counts are alike, or EP 1. Computed
    from the routing alone (`expert_counts`), not from the rank's program."""
    if not distinct_experts(model, layout):
        return ()
    shard = ExpertShard(ep=layout.ep, etp=layout.etp, ep_rank=ep_coord(layout, rank))
    # the rank's T: rank_tokens of its CP shard (RankContext.local_model), b·(s/cp)/t
    tokens = layout.micro_batch * (model.seq_len // layout.cp) // layout.tp
    pp = layout.coords(rank).pp
    return tuple(tuple(sorted(local_expert_tokens(model, layer, tokens, shard)))
                 for stage in layout.stages_of_rank(pp)
                 for layer in layout.layers_of_stage(model, stage) if is_moe_layer(model, layer))


def rank_tokens(model: ModelSpec, b: int, t: int) -> int:
    """T: the tokens one rank routes per micro-batch (the SP shard with TP)."""
    return b * model.seq_len // t


def local_expert_tokens(model: ModelSpec, layer: int, tokens: int, shard: ExpertShard
                        ) -> tuple[int, ...]:
    """Tokens each of the rank's E/EP experts processes: every one of the EP·ETP ranks that
    send to it routes its `tokens` alike, so EP·ETP·counts[e]."""
    per = model.experts // shard.ep
    counts = expert_counts(model, layer, tokens)
    first = shard.ep_rank * per
    return tuple(shard.ep * shard.etp * c for c in counts[first:first + per])


def dispatch_tokens(model: ModelSpec, layer: int, tokens: int, ep: int) -> tuple[int, ...]:
    """Tokens one rank sends to each EP rank in layer `layer`'s dispatch (and receives back in
    its combine): the counts of the experts that EP rank holds."""
    per = model.experts // ep
    counts = expert_counts(model, layer, tokens)
    return tuple(sum(counts[d * per:(d + 1) * per]) for d in range(ep))


def dispatch_matrix(model: ModelSpec, layer: int, tokens: int, ep: int) -> list[list[float]]:
    """Bytes EP rank i sends EP rank j in layer `layer`'s dispatch: tokens × h × e (every
    source routes alike, so the rows are equal)."""
    row = [n * model.hidden * model.dtype_bytes
           for n in dispatch_tokens(model, layer, tokens, ep)]
    return [list(row) for _ in range(ep)]


def moe_layer_kernels(model: ModelSpec, b: int, t: int, sp: bool, layer: int,
                      shard: ExpertShard, grad_bytes: int | None = None) -> list[KernelWork]:
    """Layer `layer`'s kernels in forward order (module docstring); a dense layer's own
    `layer_kernels` when it is not an MoE layer."""
    if not is_moe_layer(model, layer):
        return layer_kernels(model, b, t, sp, grad_bytes)
    g = model.dtype_bytes if grad_bytes is None else grad_bytes
    shared = model.shared_experts * model.moe_ffn_hidden
    dense = layer_kernels(dataclasses.replace(model, ffn_hidden=shared or model.ffn_hidden),
                          b, t, sp, grad_bytes, mlp_norm=False)  # ln2: TENorm before the router
    at = next(i for i, k in enumerate(dense) if k.name is K.LN2) + 1
    mlp = [k for k in dense[at:] if k.name is not K.BDA2]
    tokens = rank_tokens(model, b, t)
    routed = routed_kernels(model, layer, tokens, shard, g)
    return [*dense[:at], *routed, *(mlp if shared else []), dense[-1]]


def routed_kernels(model: ModelSpec, layer: int, tokens: int, shard: ExpertShard,
                   grad_bytes: int) -> list[KernelWork]:
    """Router to unpermute for one rank's `tokens` (module docstring)."""
    T, E, h, e = tokens, model.experts, model.hidden, model.dtype_bytes
    kept = sum(expert_counts(model, layer, T))  # A
    f = model.moe_ffn_hidden // shard.etp
    f1 = 2 * f if model.ffn == "swiglu" else f
    local = local_expert_tokens(model, layer, T, shard)
    received = sum(local)
    sort = chunk_sort_rows(model, local)
    out = [
        gemm_kernel(K.ROUTER, (1, T, E, h), e, grad_bytes),
        stepped(K.TOPK, router_steps(model, T)),
        memory_kernel(K.AUX_LOSS, T * E * FP32, T * E * FP32),
        stepped(K.PERMUTE, joined(permute_steps(model, T, kept),
                                  chunk_sort_steps(model, sort, True))),
        *_cast(expert_casts(model, received, f1, h, len(local)), expert_gemms(
            K.EXPERT_FC1, local, f1, h, model, grad_bytes)),
        _expert_activation(model, received, f),
        *_cast(expert_casts(model, received, h, f, len(local)), expert_gemms(
            K.EXPERT_FC2, local, h, f, model, grad_bytes)),
        stepped(K.UNPERMUTE, joined(unpermute_steps(model, T, kept),
                                    chunk_sort_steps(model, sort, False))),
    ]
    return out


def expert_casts(model: ModelSpec, rows: int, n: int, k: int, experts: int
                 ) -> tuple[KernelWork, KernelWork] | None:
    """The FP8 quantization around the `experts` local experts' GEMMs (rows, n, k) over their
    `rows` received rows (module docstring): the input's R·k elements forward, the output
    gradient's R·n backward, as the recipe casts a GEMM's (`traces.fp8_recipes`); None
    without FP8."""
    if not model.fp8:
        return None
    rec = recipe(model)
    a, w, c = rows * k, experts * k * n, rows * n
    non_tn = model.fp8_non_tn  # GroupedLinear's quantizers are Linear's (`traces.fp8_recipes`)
    fwd, bwd = input_casts(rec, a, w, False, non_tn), backward_casts(rec, a, w, c, non_tn)
    if not rec.rht:
        return (memory_kernel(K.EXPERT_CAST, sum(kw.mem_bytes for kw in fwd), 0.0),
                memory_kernel(K.EXPERT_CAST_GRAD, 0.0, sum(kw.bwd_bytes for kw in bwd)))
    # NVFP4: the Hadamard transforms' FLOPs and the stochastic rounding's draws as well
    return (KernelWork(K.EXPERT_CAST, sum(kw.flops for kw in fwd),
                       sum(kw.mem_bytes for kw in fwd), 0.0, 0.0),
            KernelWork(K.EXPERT_CAST_GRAD, 0.0, 0.0, sum(kw.bwd_flops for kw in bwd),
                       sum(kw.bwd_bytes for kw in bwd),
                       bwd_draws=sum(kw.bwd_draws for kw in bwd)))


def _cast(casts: tuple[KernelWork, KernelWork] | None, gemms: list[KernelWork]
          ) -> list[KernelWork]:
    """`gemms` between their input's cast and their output gradient's (forward order)."""
    return [casts[0], *gemms, casts[1]] if casts and gemms else gemms


def _expert_activation(model: ModelSpec, received: int, f: int) -> KernelWork:
    """`mlp_activation`'s bytes over n = received·f values: SwiGLU 3ne forward and
    (5 + 2·bias)ne backward, GeLU 2ne and (3 + bias)ne; weighted by the routing probabilities
    (`moe_probs_in_activation`) it also reads them, and writes their gradients."""
    n, e, bias = received * f, model.dtype_bytes, 1 if model.bias else 0
    fwd, bwd = activation_prob_bytes(model, received)  # weighted (`traces.moe_probs`)
    if model.ffn == "swiglu":
        return memory_kernel(K.EXPERT_ACT, 3 * n * e + fwd, (5 + 2 * bias) * n * e + bwd)
    return memory_kernel(K.EXPERT_ACT, 2 * n * e + fwd, (3 + bias) * n * e + bwd)
