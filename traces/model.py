"""Decoder arithmetic: parameters, closed-form FLOPs, Megatron's step FLOPs.

Notation follows the Megatron-LM papers: b micro-batch, s sequence, h hidden, a heads,
g kv_heads (key/value heads, = a without grouped-query attention), d `head_dim` (h/a unless
stated: Megatron's kv_channels), l layers, V vocabulary, f MLP width (4h for GPT), t
tensor-parallel degree. FLOPs count the matrix multiplications only (2 FLOPs per
multiply-add), as the papers do; with q = ad the query's width (h when d = h/a):

    attention forward   2bsh*(q + 2gd) (QKV) + 2bs^2q (QK^T) + 2bs^2q (AV) + 2bsqh (proj)
                                          = 8bsh^2 + 4bs^2h when g = a, d = h/a (MHA)
    MLP forward         2bsh*f + 2bsf*h                           = 4bshf (GeLU)
                        2bsh*2f + 2bsf*h                          = 6bshf (SwiGLU: gate, up,
                                                                    down)
    logits forward      2bshV
    backward            twice the forward of the same op

3x these per sample is Megatron-LM's `num_floating_point_operations` (megatron/training/
training.py): 12bslh^2 * ((1 + g/a + s/h)·ad/h + f/h * (3/2 if swiglu) + V/(2lh)), full s^2
attention (no causal halving), so a GPT-shaped model's figures are the papers'; ad/h is its
query_projection_to_hidden_size_ratio (kv_channels·a/h, 1 when d = h/a).

Published shapes (Qwen3): `head_dim` d set on its own, so q = ad may differ from h, and
`qk_norm`, a norm on each query and key head: `traces.heads`.

Llama-style options (`kv_heads`, `ffn = "swiglu"`, `norm = "rmsnorm"`, `position = "rope"`,
`bias = false`) change the parameter counts below and the kernels of `traces.kernels`;
`dtype = "fp8"` runs the GEMMs in FP8 (Transformer Engine) and everything else in bf16;
`dtype = "fp4"` runs them in NVFP4 (Megatron-Core's --fp4-format e2m1, `traces.fp8_recipes`).
`kv_lora_rank` selects multi-head latent attention (DeepSeek-V2/V3), whose arithmetic is in
`traces.mla`. `mtp_layers` adds multi-token prediction depths (`traces.mtp`).

Mixture of experts (`experts`, `top_k`, ...): model FLOPs count the activated experts only
(`traces.moe_spec` gives the forms and the parameters).

A whole step's FLOPs in closed form: `traces.step_flops`; per kernel: `traces.kernels`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from traces import mla
from traces.errors import ConfigError, show
from traces.fp8_recipes import FP4_RECIPES, FP8_RECIPES
from traces.heads import check_heads
from traces.model_choices import ATTENTIONS, FFNS, NORMS, POSITIONS, STACKS
from traces.moe_spec import check_moe, expert_params, is_moe_layer, moe_mlp_params, num_moe_layers
from traces.mtp import check_mtp, mtp_indices, mtp_params, mtp_stage_extra

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
"""Bytes per element of the dtypes tensors are stored and communicated in."""
DTYPES = (*DTYPE_BYTES, "fp8", "fp4")
"""`model.dtype` choices: fp8 is Transformer Engine's recipe, GEMMs in FP8 with bf16 storage,
bf16 communication and bf16 mixed-precision optimizer (its data dtype is bf16); fp4 likewise
with the GEMMs in FP4 (Megatron-Core's --fp4-format e2m1, the only FP4 format it takes)."""
QUANTIZED = ("fp8", "fp4")
"""The dtypes whose GEMMs Transformer Engine quantizes (`traces.fp8`)."""
# Upper bounds, far beyond any published model (GPT-3: 96 layers, h 12288, V 51200), that keep
# every count finite and every plan buildable.
MAX_DIMS = {"layers": 2**16, "hidden": 2**20, "heads": 2**16, "seq_len": 2**24, "vocab": 2**24,
            "ffn_hidden": 2**22}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder of pre-norm blocks: attention and an MLP. GPT-style by default (multi-head
    attention, GeLU MLP of 4h, LayerNorm, learned positions, biases); Llama-style with
    `kv_heads`, `ffn = "swiglu"`, `norm = "rmsnorm"`, `position = "rope"`, `bias = False`."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn_hidden: int = 0
    """MLP width f; 0 means 4 * hidden."""
    dtype: str = "bf16"
    tied_embeddings: bool = True
    """Output layer shares the input embedding (Megatron GPT's default)."""
    attention: str = "flash"
    """The attention core's implementation: "flash" (one fused kernel; scores never stored) or
    "unfused" (Megatron-LM before 2023: QKᵀ, softmax, dropout and AV over b·a·s² scores)."""
    kv_heads: int = 0
    """Key/value heads g (Megatron's num_query_groups): < heads is grouped-query attention,
    1 multi-query; 0 means heads (multi-head attention). Must divide heads."""
    ffn: str = "gelu"
    """The MLP: "gelu" (fc1, GeLU, fc2) or "swiglu" (gate and up projections of width
    ffn_hidden, silu(gate)·up, down projection; ffn_hidden is then required)."""
    norm: str = "layernorm"
    """"layernorm" (weight and bias) or "rmsnorm" (weight only)."""
    position: str = "learned"
    """"learned" absolute position embeddings or "rope" (rotary, applied to q and k)."""
    bias: bool = True
    """Biases on the linear layers (QKV, proj, fc1, fc2); Llama has none."""
    dropout: float = 0.1
    """Dropout probability of the hidden states and the attention probabilities (Megatron-LM's
    --hidden-dropout and --attention-dropout, 0.1 by default; Llama and DeepSeek train with
    0). Each dropout draws a random number per element and keeps a 1-byte mask; 0 draws none,
    keeps none, and runs no attention dropout (`traces.kernels`)."""
    fp8_recipe: str = ""
    """With dtype = "fp8", one of FP8_RECIPES (`traces.fp8_recipes` says what each costs).
    Left out, the accelerator's (`sim.config`): "mxfp8" on Blackwell, else "delayed" (and
    "delayed" when the model is built on its own)."""
    fp4_recipe: str = ""
    """With dtype = "fp4", one of FP4_RECIPES: "nvfp4" (Megatron-Core's --fp4-recipe, TE's
    NVFP4BlockScaling; `traces.fp8_recipes`), the one it takes when left out."""
    fp8_non_tn: bool = False
    """The accelerator runs FP8 GEMMs in non-TN layouts (TE's is_non_tn_fp8_gemm_supported():
    compute capability 10.x, Blackwell), so delayed and tensorwise scaling write no transposed
    FP8 copy (`traces.fp8_recipes`). Not a config key: `sim.config` derives it from the
    accelerator, as it does the default fp8_recipe, for those two recipes only; a trace
    header carries it."""
    head_dim: int = 0
    """A head's width d (Megatron's kv_channels); 0 means hidden / heads (`traces.heads`). With
    latent attention DeepSeek's qk_nope_head_dim (a q/k head is head_dim + qk_rope_head_dim)."""
    qk_norm: bool = False
    """Each query and key head normalized before RoPE (Qwen3; `traces.heads`)."""
    q_lora_rank: int = 0
    """Latent attention: the compressed query's width; 0 projects the query directly."""
    kv_lora_rank: int = 0
    """Latent attention's compressed key/value width c_KV; > 0 selects MLA (`traces.mla`)."""
    qk_rope_head_dim: int = 0
    """Latent attention: the rotary part of each query/key head (k's shared by all heads)."""
    v_head_dim: int = 0
    """Latent attention: a value head's width; 0 means head_dim."""
    # Mixture of experts (`traces.moe`): experts > 0 makes every layer from dense_layers on an
    # MoE layer; the rules are `traces.moe.check_moe`'s.
    experts: int = 0
    """Routed experts per MoE layer; 0: a dense model."""
    top_k: int = 0
    """Experts each token visits (required with experts)."""
    moe_ffn_hidden: int = 0
    """Width of each routed (and shared) expert's MLP; 0 means ffn_hidden."""
    shared_experts: int = 0
    """Always-on experts of moe_ffn_hidden width (DeepSeek's shared experts)."""
    dense_layers: int = 0
    """The first layers keep a dense MLP of ffn_hidden (DeepSeek-V3: 3)."""
    capacity_factor: float = 0.0
    """Tokens an expert accepts relative to the balanced share; 0: dropless."""
    routing_skew: float = 0.0
    """0: balanced routing; > 0: expert popularity Zipf-distributed with this exponent."""
    routing_seed: int = 0
    """Seed of each MoE layer's permutation of expert popularity."""
    router_groups: int = 0
    """Expert groups of group-limited routing (`traces.moe_groups`); 0: no groups."""
    router_group_topk: int = 0
    """Groups each token's experts may lie in (DeepSeek-V3: 4 of 8)."""
    force_balance: bool = False
    """Routing perfectly balanced whatever routing_skew (NVIDIA's benchmark setting)."""
    dispatch: str = "nccl"
    """The token dispatch: "nccl" all-to-all, "deepep" (`traces.deepep`) or "hybridep"
    (`traces.hybridep`)."""
    moe_grouped_gemm: bool = True
    """One grouped GEMM over a rank's experts; false: a GEMM per expert (`traces.moe_steps`)."""
    moe_gemm_streams: int | None = None
    """How the grouped GEMM runs (`sim.models.compute.expert_rounds`): 0, one kernel over every
    local expert's tiles; S > 0, Transformer Engine's cuBLAS path, one GEMM per expert, expert
    i's on compute stream i mod S (TE's S = 4), the S in flight sharing the SMs; with FP8,
    GroupedLinear's per-expert quantize kernels (`sim.models.host.device_launches`). Unset
    (None): the stack's, `traces.moe_spec.gemm_streams` (4 under kernels = "fused" with
    moe_grouped_gemm: Megatron-Core's TEGroupedMLP; else 0); a stated value always wins."""
    moe_permute_fusion: bool = True
    """Fused token permute/unpermute kernels (Megatron's --moe-permute-fusion)."""
    moe_router_fusion: bool = True
    """Fused router score, top-k and probability kernel (Megatron's --moe-router-fusion)."""
    moe_router_score_function: str = "softmax"
    """The router's score: "softmax" or "sigmoid" (DeepSeek-V3; `traces.moe_steps`)."""
    moe_router_enable_expert_bias: bool = False
    """Aux-loss-free routing: a per-expert bias on the scores picks the top-k (DeepSeek-V3)."""
    moe_probs_in_activation: bool = False
    """Routing weights applied in the experts' activation, not in the unpermute (Megatron-Core
    >= 0.12.1, 0.13's CHANGELOG; `traces.moe_probs`)."""
    mtp_layers: int = 0
    """Multi-token prediction depths (`traces.mtp`; Megatron-Core's --mtp-num-layers)."""
    kernels: str = "fused"
    """The software stack's kernels (`traces.stack`): "fused" (Megatron-Core / Transformer
    Engine), "compiled" (torch.compile's inductor) or "eager" (eager PyTorch, the executor's)."""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"model.{name}: {show(value)} must be a positive integer")
            if value > MAX_DIMS[name]:
                raise ConfigError(f"model.{name}: {show(value)} is larger than {MAX_DIMS[name]:,}")
        if not isinstance(self.ffn_hidden, int) or isinstance(self.ffn_hidden, bool) or \
                not 0 <= self.ffn_hidden <= MAX_DIMS["ffn_hidden"]:
            raise ConfigError(f"model.ffn_hidden: {show(self.ffn_hidden)} must be a positive "
                              f"integer up to {MAX_DIMS['ffn_hidden']:,} (or 0 for 4 * hidden)")
        for name, choices in (("ffn", FFNS), ("norm", NORMS), ("position", POSITIONS),
                              ("dtype", DTYPES), ("kernels", STACKS)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in choices:
                raise ConfigError(f"model.{name}: {show(value)} is not one of "
                                  f"{', '.join(choices)}")
        if self.ffn_hidden == 0:
            if self.ffn == "swiglu":
                raise ConfigError("model.ffn_hidden: required with ffn = \"swiglu\" (its width "
                                  "is the model's own, e.g. 28672 for Llama-3-70B)")
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if not isinstance(self.bias, bool):
            raise ConfigError(f"model.bias: {show(self.bias)} must be true or false")
        p = self.dropout
        if isinstance(p, bool) or not isinstance(p, int | float) or not math.isfinite(p) or \
                not 0 <= p < 1:
            raise ConfigError(f"model.dropout: {show(p)} must be a probability from 0 to below 1")
        if not isinstance(self.attention, str) or self.attention not in ATTENTIONS:
            raise ConfigError(f"model.attention: {show(self.attention)} is not one of "
                              f"{', '.join(ATTENTIONS)}")
        if not isinstance(self.tied_embeddings, bool):
            raise ConfigError(f"model.tied_embeddings: {show(self.tied_embeddings)} must be "
                              "true or false")
        if not self.head_dim and self.hidden % self.heads:  # d = h/a must be whole
            raise ConfigError(f"model.hidden: {self.hidden} is not divisible by "
                              f"model.heads = {self.heads}")
        if self.fp8_recipe not in ("", *FP8_RECIPES) or not isinstance(self.fp8_recipe, str):
            raise ConfigError(f"model.fp8_recipe: {show(self.fp8_recipe)} is not one of "
                              f"{', '.join(FP8_RECIPES)}")
        if self.fp8_recipe and self.dtype != "fp8":
            raise ConfigError(f"model.fp8_recipe: {show(self.fp8_recipe)} applies only with "
                              f"model.dtype = \"fp8\", not {show(self.dtype)}")
        if self.fp8 and not self.fp4 and not self.fp8_recipe:
            object.__setattr__(self, "fp8_recipe", "delayed")
        if not isinstance(self.fp8_non_tn, bool) or (self.fp8_non_tn and self.dtype != "fp8"):
            raise ConfigError(f"model.fp8_non_tn: {show(self.fp8_non_tn)} must be true or false, "
                              "and true only with model.dtype = \"fp8\"")
        if self.fp4_recipe not in ("", *FP4_RECIPES) or not isinstance(self.fp4_recipe, str):
            raise ConfigError(f"model.fp4_recipe: {show(self.fp4_recipe)} is not one of "
                              f"{', '.join(FP4_RECIPES)}")
        if self.fp4_recipe and not self.fp4:
            raise ConfigError(f"model.fp4_recipe: {show(self.fp4_recipe)} applies only with "
                              f"model.dtype = \"fp4\", not {show(self.dtype)}")
        if self.fp4 and not self.fp4_recipe:
            object.__setattr__(self, "fp4_recipe", FP4_RECIPES[0])
        if self.fp4 and self.kernels != "fused":
            raise ConfigError(f"model.kernels: {show(self.kernels)} with model.dtype = \"fp4\": "
                              "NVFP4 is Transformer Engine's recipe (Megatron-Core's --fp4-recipe "
                              "nvfp4), modelled on the fused stack only")
        kv = self.kv_heads
        if not isinstance(kv, int) or isinstance(kv, bool) or not 0 <= kv <= self.heads:
            raise ConfigError(f"model.kv_heads: {show(kv)} must be an integer from 1 to "
                              f"model.heads = {self.heads} (or 0 for heads)")
        if kv == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        elif self.heads % kv:
            raise ConfigError(f"model.kv_heads: {kv} does not divide model.heads = {self.heads}")
        mla.check_mla(self)
        check_heads(self)
        check_moe(self)
        check_mtp(self)

    @property
    def dtype_bytes(self) -> int:
        """Bytes of a stored or communicated element (fp8 and fp4 models keep them in bf16)."""
        return DTYPE_BYTES[self.data_dtype]

    @property
    def data_dtype(self) -> str:
        """The dtype of parameters, activations and communication: bf16 for an fp8 or fp4
        model (Transformer Engine casts only the GEMMs' operands to FP8 or FP4)."""
        return "bf16" if self.dtype in QUANTIZED else self.dtype

    @property
    def fp8(self) -> bool:
        """Transformer Engine quantizes the GEMMs: dtype fp8, or fp4, whose NVFP4 recipe runs
        through the same machinery with its own bytes and rate (`traces.fp8_recipes`)."""
        return self.dtype in QUANTIZED

    @property
    def fp4(self) -> bool:
        """The GEMMs run in FP4 (NVFP4) at the accelerator's FP4 rate."""
        return self.dtype == "fp4"

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (`traces.mla`)."""
        return self.kv_lora_rank > 0

    @property
    def q_width(self) -> int:
        """a·d: the width of the Q projection (h when d = h/a; Megatron's query_projection_size)."""
        return self.heads * self.head_dim

    @property
    def qk_norm_params(self) -> int:
        """qk_norm's weights of d for q and k (and biases with LayerNorm), replicated over TP."""
        return 2 * (2 if self.norm == "layernorm" else 1) * self.head_dim if self.qk_norm else 0

    @property
    def kv_width(self) -> int:
        """g·d: the width of the K (and of the V) projection."""
        return self.kv_heads * self.head_dim

    @property
    def fc1_width(self) -> int:
        """fc1's output width: f, or 2f for SwiGLU (Megatron fuses gate and up in fc1)."""
        return 2 * self.ffn_hidden if self.ffn == "swiglu" else self.ffn_hidden

    @property
    def norm_params(self) -> int:
        """One norm's parameters: weight and bias (2h) for LayerNorm, weight (h) for RMSNorm."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    # --- parameters -------------------------------------------------------------------------

    def layer_params(self, tp: int = 1, layer: int | None = None, ep: int = 1,
                     etp: int = 1) -> float:
        """Parameters of one block held by one tensor-parallel rank.

        Split by t: QKV weight h(q + 2gd) and bias q + 2gd (q = ad), proj weight qh, fc1
        weight h·f1 and bias f1 (f1 = f, or 2f for SwiGLU's gate and up), fc2 weight fh.
        Replicated: the proj and fc2 biases (h each), two norms (2h or h each) and qk_norm's
        (`qk_norm_params`).
        GPT (g = a, d = h/a, f1 = f, biases, LayerNorm): (4h^2 + 3h + 2hf + f)/t + 6h.
        Latent attention: `traces.mla.mla_params` in place of QKV and proj. An MoE `layer`
        (`traces.moe_spec.moe_mlp_params`) has the router, shared experts and E/ep routed
        experts split by etp in place of fc1 and fc2 (and the fc2 bias)."""
        h, f, f1, kv = self.hidden, self.ffn_hidden, self.fc1_width, self.kv_width
        moe = layer is not None and is_moe_layer(self, layer)
        if self.mla:
            attn, replicated = mla.mla_params(self)
            if moe:
                return (attn / tp + replicated + 2 * self.norm_params
                        + moe_mlp_params(self, tp, ep, etp))
            return (attn + h * f1 + f * h) / tp + (replicated + 2 * self.norm_params)
        q = self.q_width
        qkv, norms = q + 2 * kv, 2 * self.norm_params + self.qk_norm_params
        if moe:
            attn = h * qkv + q * h + (qkv if self.bias else 0)
            return (attn / tp + (h if self.bias else 0) + norms
                    + moe_mlp_params(self, tp, ep, etp))
        split = h * qkv + q * h + h * f1 + f * h + (qkv + f1 if self.bias else 0)
        return split / tp + ((2 * h if self.bias else 0) + norms)

    def attn_params(self) -> int:
        """One layer's attention parameters without ln1 (QKV and proj with their biases and
        qk_norm's weights, or latent attention's projections and norms)."""
        if self.mla:
            return sum(mla.mla_params(self))
        h, q = self.hidden, self.q_width
        qkv = q + 2 * self.kv_width
        return h * qkv + q * h + (qkv + h if self.bias else 0) + self.qk_norm_params

    def layers_params(self, layers: Iterable[int], tp: int = 1, ep: int = 1,
                      etp: int = 1) -> float:
        """`layer_params` summed over `layers` (dense and MoE alike)."""
        return sum(self.layer_params(tp, layer, ep, etp) for layer in layers)

    def embedding_params(self, tp: int = 1) -> float:
        """Word embeddings (vocab-parallel) plus learned positions (replicated; none with
        rotary positions)."""
        positions = self.seq_len * self.hidden if self.position == "learned" else 0
        return self.vocab * self.hidden / tp + positions

    def head_params(self, tp: int = 1) -> float:
        """Final norm plus the output projection (a copy of the embedding when tied)."""
        return self.norm_params + self.vocab * self.hidden / tp

    def params_on_stages(self, stages: Sequence[int], num_stages: int, tp: int,
                         num_layers: int | None = None, *, layers: Iterable[int] | None = None,
                         ep: int = 1, etp: int = 1) -> float:
        """Parameters one GPU holds before ZeRO sharding when it runs virtual stages `stages`
        of `num_stages` at tensor parallelism `tp`: their layers (`num_layers` of them, or
        an even share), the embeddings with stage 0, the output layer with the last stage
        (with tied embeddings on another GPU, Megatron keeps a copy there and all-reduces its
        gradient with the first stage). An MoE model's per-layer counts need `layers`, the
        layer indices, and its expert degrees `ep`, `etp`."""
        if num_layers is None:
            num_layers = len(stages) * (self.layers // num_stages)
        if layers is not None and self.experts:
            params = self.layers_params(layers, tp, ep, etp)
        else:
            params = num_layers * self.layer_params(tp)
        if 0 in stages:
            params += self.embedding_params(tp)
        if num_stages - 1 in stages:
            params += self.head_params_on_stages(stages, tp) + mtp_stage_extra(self, stages, tp)
        return params

    def head_params_on_stages(self, stages: Sequence[int], tp: int) -> float:
        """The output layer's parameters on the GPU running the last stage among `stages`:
        just the final norm when the output weights are the embedding tensor itself (tied,
        and stage 0 on the same GPU)."""
        if self.tied_embeddings and 0 in stages:
            return self.norm_params
        return self.head_params(tp)

    def num_params(self) -> float:
        """All distinct parameters (a tied output layer counted once; MTP's own, `traces.mtp`)."""
        head = self.norm_params if self.tied_embeddings else self.head_params()
        return self.layers_params(range(self.layers)) + self.embedding_params() + head + \
            mtp_params(self)

    def active_params(self) -> float:
        """Parameters a token runs through: an MoE model's top-k of its routed experts."""
        moe = num_moe_layers(self) + sum(is_moe_layer(self, i) for i in mtp_indices(self))
        inactive = (self.experts - self.top_k) * expert_params(self) * moe
        return self.num_params() - inactive

    # --- FLOPs per micro-batch, per tensor-parallel rank ---------------------------------------

    def attn_flops(self, micro_batch: int, tp: int = 1) -> float:
        """QKV 2bsh(q + 2gd), QKᵀ and AV 4bs²q, proj 2bsqh, q = ad (module docstring);
        latent attention's in `traces.mla.mla_flops`."""
        if self.mla:
            return mla.mla_flops(self, micro_batch, tp)
        b, s, h, q = micro_batch, self.seq_len, self.hidden, self.q_width
        qkv = 2 * b * s * h * (q + 2 * self.kv_width)
        return (qkv + 2 * b * s * q * h + 4 * b * s * s * q) / tp

    def attn_core_flops(self, micro_batch: int, tp: int = 1) -> float:
        """QK^T and AV only (4bs²·ad): what selective recomputation re-runs."""
        if self.mla:
            return mla.mla_core_flops(self, micro_batch, tp)
        b, s = micro_batch, self.seq_len
        return 4 * b * s * s * self.q_width / tp

    def mlp_flops(self, micro_batch: int, tp: int = 1, layer: int | None = None) -> float:
        """fc1 2bsh·f1 plus fc2 2bsfh: 4bshf (GeLU), 6bshf (SwiGLU). An MoE `layer`: the same
        with f = (top_k + shared_experts)·moe_ffn_hidden, the activated experts only
        (Megatron-LM's num_floating_point_operations; the router's 2bshE is not counted)."""
        b, s, h = micro_batch, self.seq_len, self.hidden
        if layer is not None and is_moe_layer(self, layer):
            f = (self.top_k + self.shared_experts) * self.moe_ffn_hidden
            f1 = 2 * f if self.ffn == "swiglu" else f
            return 2 * b * s * h * (f1 + f) / tp
        return 2 * b * s * h * (self.fc1_width + self.ffn_hidden) / tp

    def mlps_flops(self, micro_batch: int) -> float:
        """`mlp_flops` over every layer."""
        return sum(self.mlp_flops(micro_batch, 1, layer) for layer in range(self.layers))

    def head_flops(self, micro_batch: int, tp: int = 1) -> float:
        return 2 * micro_batch * self.seq_len * self.hidden * self.vocab / tp

    def activation_bytes(self, micro_batch: int) -> float:
        """One micro-batch's b*s*h activation tensor (what pipeline stages send)."""
        return micro_batch * self.seq_len * self.hidden * self.dtype_bytes
