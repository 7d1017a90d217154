"""Mixture-of-experts rules and routing: which layers are MoE and how many tokens each expert gets.

    check_moe(model)                the `[model]` MoE keys' bounds and rules (ConfigError)
    gemm_streams(model)             the streams the experts' grouped GEMM runs on (0: one kernel)
    te_grouped_mlp(model)           whether the experts are TE's GroupedLinear (TEGroupedMLP)
    expert_popularity(model, l)     the share of layer l's routed tokens each expert receives
    expert_counts(model, l, T)      tokens each expert gets from one rank's T tokens

Routing is the expectation of top-k routing, not a sample, so it is deterministic: with
`routing_skew` α = 0 every expert gets T·k/E of a rank's T tokens; with α > 0 the expert of
popularity rank i (1-based) gets a share ∝ 1/i^α (a Zipf law), over a permutation of the experts
that each MoE layer draws from `random.Random(routing_seed · 1_000_003 + layer)`. Top-k picks k
distinct experts, so no expert gets more than T: the shares are water-filled under that cap,
then made whole numbers by largest remainder (they sum to T·k). With `capacity_factor` c > 0
an expert keeps at most ⌈c·T·k/E⌉ of them (Megatron-Core's capacity,
moe_utils.get_capacity), the rest are dropped. Every rank of an EP group routes the same way,
so expert e receives EP · counts[e] tokens in all (`traces.moe`).

FLOPs. Mixture of experts (`experts` E, `top_k` k, `shared_experts` S, `moe_ffn_hidden` f_e, the
first `dense_layers` dense): model FLOPs count the activated experts only, as Megatron-LM's MoE
branch of num_floating_point_operations does: an MoE layer's MLP forward is
2bsh·(k + S)·(f1_e + f_e) (6bsh(k + S)f_e with SwiGLU), the router's 2bshE and dropped tokens
left out, so the step is 12Bsnh^2·((1 + g/a + s/h) + F/h·(3/2 if swiglu) + V/(2nh)) with
F = ((n - n_moe)·f + n_moe·(k + S)·f_e)/n. Parameters: `expert_params`, `moe_mlp_params`.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache
from typing import Protocol

from traces.errors import ConfigError, show
from traces.moe_groups import ROUTING_KEYS, check_routing


class ModelSpec(Protocol):
    """The fields of `traces.model.ModelSpec` these rules read (it imports this module)."""

    @property
    def layers(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def ffn_hidden(self) -> int: ...
    @property
    def ffn(self) -> str: ...
    @property
    def bias(self) -> bool: ...
    @property
    def experts(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    @property
    def moe_ffn_hidden(self) -> int: ...
    @property
    def shared_experts(self) -> int: ...
    @property
    def dense_layers(self) -> int: ...
    @property
    def capacity_factor(self) -> float: ...
    @property
    def routing_skew(self) -> float: ...
    @property
    def routing_seed(self) -> int: ...
    @property
    def force_balance(self) -> bool: ...
    @property
    def router_groups(self) -> int: ...
    @property
    def router_group_topk(self) -> int: ...
    @property
    def dispatch(self) -> str: ...
    @property
    def moe_grouped_gemm(self) -> bool: ...
    @property
    def moe_gemm_streams(self) -> int | None: ...
    @property
    def kernels(self) -> str: ...
    @property
    def moe_permute_fusion(self) -> bool: ...
    @property
    def moe_router_fusion(self) -> bool: ...
    @property
    def moe_router_score_function(self) -> str: ...
    @property
    def moe_router_enable_expert_bias(self) -> bool: ...
    @property
    def moe_probs_in_activation(self) -> bool: ...

MOE_KEYS = ("experts", "top_k", "moe_ffn_hidden", "shared_experts", "dense_layers",
            "capacity_factor", "routing_skew", "routing_seed", *ROUTING_KEYS, "moe_grouped_gemm",
            "moe_gemm_streams", "moe_permute_fusion", "moe_router_fusion",
            "moe_router_score_function", "moe_router_enable_expert_bias",
            "moe_probs_in_activation")
"""The `[model]` MoE keys, written in a header only where they are set."""
MAX_EXPERTS = 2**14  # DeepSeek-V3 has 256 routed experts; 16 K is far beyond any model
MAX_SKEW = 16.0  # Zipf exponents measured on MoE routing are ~0.5-2; 16 is all on one expert
MAX_CAPACITY = 2**10
SCORE_FUNCTIONS = ("softmax", "sigmoid")
"""`moe_router_score_function`: Megatron-Core's --moe-router-score-function choices."""
MOE_KERNEL_KEYS = {"moe_grouped_gemm": True, "moe_permute_fusion": True,
                   "moe_router_fusion": True, "moe_router_enable_expert_bias": False,
                   "moe_probs_in_activation": False}
"""The boolean keys of how the MoE kernels run (`traces.moe_steps`), with their defaults."""


def check_moe(m: ModelSpec) -> None:
    """The MoE keys' bounds, and top_k <= experts, dense_layers < layers; fills moe_ffn_hidden."""
    ints = (("experts", MAX_EXPERTS), ("top_k", MAX_EXPERTS), ("moe_ffn_hidden", 2**22),
            ("shared_experts", 64), ("dense_layers", 2**16), ("routing_seed", 2**31))
    for name, top in ints:
        value = getattr(m, name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
            raise ConfigError(f"model.{name}: {show(value)} must be an integer from 0 to {top:,}")
    for name, bound in (("capacity_factor", MAX_CAPACITY), ("routing_skew", MAX_SKEW)):
        value = getattr(m, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not math.isfinite(value) or not 0 <= value <= bound:
            raise ConfigError(f"model.{name}: {show(value)} must be a number from 0 to "
                              f"{bound:g}")
    check_routing(m)
    _check_kernel_keys(m)
    if not m.experts:
        for name in ("top_k", "moe_ffn_hidden", "shared_experts", "dense_layers",
                     "capacity_factor", "routing_skew"):
            if getattr(m, name):
                raise ConfigError(f"model.{name}: {show(getattr(m, name))} needs model.experts "
                                  "> 0 (a dense model has no experts)")
        return
    if not 1 <= m.top_k <= m.experts:
        raise ConfigError(f"model.top_k: {show(m.top_k)} must be from 1 to model.experts = "
                          f"{m.experts}")
    if m.dense_layers >= m.layers:
        raise ConfigError(f"model.dense_layers: {m.dense_layers} must be fewer than "
                          f"model.layers = {m.layers} (some layer must be MoE)")
    if m.capacity_factor and m.capacity_factor * m.top_k < 1 / m.experts:
        raise ConfigError(f"model.capacity_factor: {m.capacity_factor} leaves no expert any "
                          "token")
    if m.moe_ffn_hidden == 0:
        object.__setattr__(m, "moe_ffn_hidden", m.ffn_hidden)


def _check_kernel_keys(m: ModelSpec) -> None:
    """The MoE kernel keys are booleans and a score function, set away from their defaults
    only on an MoE model."""
    for name, default in MOE_KERNEL_KEYS.items():
        value = getattr(m, name)
        if not isinstance(value, bool):
            raise ConfigError(f"model.{name}: {show(value)} must be true or false")
        if value != default and not m.experts:
            raise ConfigError(f"model.{name}: {show(value)} needs model.experts > 0 (a dense "
                              "model has no experts)")
    streams = m.moe_gemm_streams
    if streams is None:
        pass  # the stack's (`gemm_streams`)
    elif not isinstance(streams, int) or isinstance(streams, bool) or not 0 <= streams <= 64:
        raise ConfigError(f"model.moe_gemm_streams: {show(streams)} must be an integer from 0 "
                          "to 64")
    elif streams and not (m.experts and m.moe_grouped_gemm):
        raise ConfigError(f"model.moe_gemm_streams: {streams} needs model.experts > 0 and "
                          "model.moe_grouped_gemm (it says how the grouped GEMM runs)")
    score = m.moe_router_score_function
    if not isinstance(score, str) or score not in SCORE_FUNCTIONS:
        raise ConfigError(f"model.moe_router_score_function: {show(score)} is not one of "
                          f"{', '.join(SCORE_FUNCTIONS)}")
    if score != "softmax" and not m.experts:
        raise ConfigError(f"model.moe_router_score_function: {show(score)} needs "
                          "model.experts > 0 (a dense model has no router)")


TE_GEMM_STREAMS = 4
"""The compute streams Transformer Engine's GroupedLinear runs its per-expert GEMMs on:
nvte_multi_tensor_gemm takes its cuBLAS path unless the GPU is Hopper, the operands BF16 and
NVTE_USE_CUTLASS_GROUPED_GEMM set (off by default), and multi_stream_cublas_gemm launches
expert i's GEMM on compute stream i % num_streams (NVIDIA/TransformerEngine
transformer_engine/common/gemm/cublaslt_gemm.cu @0143a5e); num_streams is 4
(transformer_engine/common/util/multi_stream.cpp @3e125d6, get_num_compute_streams)."""


def gemm_streams(m: ModelSpec) -> int:
    """The streams a rank's experts' grouped GEMM runs on (`sim.models.compute.expert_rounds`;
    0: one kernel over every local expert's tiles): `moe_gemm_streams` where the config states
    it, else the stack's. Under `kernels = "fused"` (Megatron-Core with Transformer Engine)
    --moe-grouped-gemm builds TEGroupedMLP on TE's GroupedLinear unless
    --moe-use-legacy-grouped-gemm (NVIDIA/Megatron-LM megatron/core/extensions/
    transformer_engine_spec_provider.py, TESpecProvider.grouped_mlp_modules; the MoE README's
    --moe-grouped-gemm: "launch multiple local GEMM kernels in multiple streams ... with
    GroupedLinear in TransformerEngine"): `TE_GEMM_STREAMS`. torchtitan's stacks (compiled,
    eager) run torch._grouped_mm, one kernel; so does DeepGEMM's m_grouped_*_contiguous
    (deepseek-ai/DeepGEMM README.md, "Grouped GEMMs (contiguous layout)": the experts' tokens
    concatenated into one tensor), which a config states as 0. Without grouped GEMM there is
    no grouped op to split."""
    if m.moe_gemm_streams is not None:
        return m.moe_gemm_streams
    return TE_GEMM_STREAMS if te_grouped_mlp(m) else 0


def te_grouped_mlp(m: ModelSpec) -> bool:
    """Whether the experts run as Megatron-Core's TEGroupedMLP, Transformer Engine's
    GroupedLinear: grouped GEMM under the fused stack (`gemm_streams`), whatever streams a
    config states (TE's CUTLASS path is GroupedLinear too)."""
    return bool(m.experts and m.moe_grouped_gemm and m.kernels == "fused")


def is_moe_layer(m: ModelSpec, layer: int) -> bool:
    return m.experts > 0 and layer >= m.dense_layers


def num_moe_layers(m: ModelSpec) -> int:
    return m.layers - m.dense_layers if m.experts else 0


def expert_popularity(m: ModelSpec, layer: int) -> tuple[float, ...]:
    """Each expert's share of layer `layer`'s routed tokens (module docstring); sums to 1."""
    return _popularity(m.experts, float(m.routing_skew), m.routing_seed, layer)


@lru_cache(maxsize=4096)
def _popularity(experts: int, skew: float, seed: int, layer: int) -> tuple[float, ...]:
    if skew == 0:
        return (1 / experts,) * experts
    weights = [1 / (i + 1) ** skew for i in range(experts)]
    order = list(range(experts))
    random.Random(seed * 1_000_003 + layer).shuffle(order)
    total = sum(weights)
    shares = [0.0] * experts
    for popularity_rank, expert in enumerate(order):
        shares[expert] = weights[popularity_rank] / total
    return tuple(shares)


def expert_counts(m: ModelSpec, layer: int, tokens: int) -> tuple[int, ...]:
    """Tokens each expert keeps of one rank's `tokens` in layer `layer` (module docstring)."""
    skew = 0.0 if m.force_balance else float(m.routing_skew)
    return _counts(m.experts, m.top_k, skew, m.routing_seed, layer, tokens,
                   float(m.capacity_factor))


@lru_cache(maxsize=4096)
def _counts(experts: int, k: int, skew: float, seed: int, layer: int, tokens: int,
            capacity_factor: float) -> tuple[int, ...]:
    shares = list(_popularity(experts, skew, seed, 0 if skew == 0 else layer))
    routed = tokens * k
    ideal = _water_fill(shares, routed, tokens)
    counts = [math.floor(x) for x in ideal]
    by_remainder = sorted(range(experts), key=lambda e: (counts[e] - ideal[e], e))
    for e in by_remainder[:routed - sum(counts)]:
        counts[e] += 1
    if capacity_factor:
        cap = math.ceil(capacity_factor * routed / experts)
        counts = [min(c, cap) for c in counts]
    return tuple(counts)


def _water_fill(shares: list[float], total: float, cap: float) -> list[float]:
    """`total` split in proportion to `shares`, none above `cap` (the excess re-split over the
    rest, in proportion)."""
    out = [0.0] * len(shares)
    free = set(range(len(shares)))
    left = total
    while free:
        weight = sum(shares[e] for e in free)
        over = {e for e in free if left * shares[e] / weight > cap}
        if not over:
            for e in free:
                out[e] = left * shares[e] / weight
            break
        for e in over:
            out[e] = cap
        left -= cap * len(over)
        free -= over
    return out


def expert_params(m: ModelSpec) -> float:
    """One routed expert's MLP: fc1 h·f1 and fc2 f·h (f = moe_ffn_hidden, f1 = 2f for SwiGLU),
    with biases f1 + h."""
    h, f = m.hidden, m.moe_ffn_hidden
    f1 = 2 * f if m.ffn == "swiglu" else f
    return h * f1 + f * h + ((f1 + h) if m.bias else 0)


def moe_mlp_params(m: ModelSpec, tp: int = 1, ep: int = 1, etp: int = 1) -> float:
    """An MoE layer's MLP on one rank: the router h·E (replicated, Megatron's TopKRouter has no
    bias), the shared experts as one MLP of width S·f split by TP (Megatron's SharedExpertMLP),
    and E/EP routed experts split by ETP."""
    shared = m.shared_experts * expert_params(m) / tp
    return m.hidden * m.experts + shared + m.experts / ep * expert_params(m) / etp
