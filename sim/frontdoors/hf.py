"""A Hugging Face `config.json` read into parasim's `[model]` keys.

    parasim simulate llama.toml --model hf:Meta-Llama-3-8B/config.json
    [model]
    from = "hf:Meta-Llama-3-8B/config.json"     # its keys, then this table's on top
    seq_len = 8192

Families (`model_type`): llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, deepseek_v2,
deepseek_v3. Every field of the file is one of three kinds:

* read: turned into a `[model]` key (`ARCH_KEYS` are the keys a config.json decides; a field
  the file leaves out takes the family's default, e.g. untied embeddings and no dropout);
* harmless (`HARMLESS`): it changes nothing a training step computes, stores or sends: token
  ids, initialisation, norm epsilon, RoPE base and scaling (the same FLOPs), the checkpoint's
  dtype and quantization (the training dtype is `[model] dtype`), inference options (cache,
  expert-parallel size of the reference code), auxiliary-loss coefficients;
* unknown: named in one warning line, and the model is read without it.

A field whose value parasim cannot express (a non-SiLU MLP, MoE layers only every n-th layer,
a sliding window shorter than the sequence) is refused with one line naming each such field:
parasim would otherwise simulate a different model. One approximation is kept: Qwen2's biases
on q, k and v (three vectors a layer, no GEMM) are left out, as `bias = false`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traces.errors import ConfigError, show
from traces.files import load_json

FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v2",
            "deepseek_v3")
ARCH_KEYS = ("layers", "hidden", "heads", "kv_heads", "vocab", "ffn", "ffn_hidden", "norm",
             "position", "bias", "tied_embeddings", "dropout", "head_dim", "qk_norm",
             "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "experts",
             "top_k", "moe_ffn_hidden", "shared_experts", "dense_layers", "router_groups",
             "router_group_topk", "moe_router_score_function",
             "moe_router_enable_expert_bias", "mtp_layers")
"""The `[model]` keys a config.json decides: `--model hf:` replaces every one of them (the
config's seq_len, dtype, attention, kernels and routing options stay)."""
HARMLESS = frozenset({
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "rms_norm_eps",
    "rope_theta", "rope_scaling", "max_position_embeddings", "use_cache", "pretraining_tp",
    "quantization_config", "ep_size", "aux_loss_alpha", "seq_aux", "routed_scaling_factor",
    "norm_topk_prob", "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
    "max_window_layers", "use_sliding_window", "sliding_window", "_name_or_path",
    "tie_word_embeddings", "attention_bias", "mlp_bias", "attention_dropout", "hidden_act",
    "head_dim", "moe_layer_freq", "topk_method", "scoring_func", "decoder_sparse_step",
    "mlp_only_layers"})
"""Fields read elsewhere or changing nothing a training step does (module docstring); the
read fields are here too so that only the truly unknown are named."""
_READ = frozenset({
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
    "vocab_size", "intermediate_size", "num_local_experts", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "n_routed_experts",
    "n_shared_experts", "first_k_dense_replace", "n_group", "topk_group", "q_lora_rank",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "num_nextn_predict_layers"})
_REQUIRED = object()


@dataclass(frozen=True)
class HfModel:
    """A config.json read: `table` holds every ARCH_KEYS key and a default seq_len; `window`
    is its sliding-window attention's span (0: none), checked against the final seq_len;
    `unknown` the fields named in the warning line."""

    table: dict[str, Any]
    window: int
    unknown: tuple[str, ...]


def read_hf(path: Path) -> HfModel:
    """The config.json at `path` read (module docstring); ConfigError naming every field
    parasim cannot express."""
    label = f"hf:{path}"
    cfg = load_json(path, what="hf")
    if not isinstance(cfg, dict):
        raise ConfigError(f"{label}: a config.json holds a JSON object, not {show(cfg)}")
    family = cfg.get("model_type")
    if family not in FAMILIES:
        raise ConfigError(f"{label}: model_type {show(family)} is not one parasim reads "
                          f"(known: {', '.join(FAMILIES)})")
    missing = [name for name in _required(family) if cfg.get(name) is None]
    if missing:
        raise ConfigError(f"{label}: missing {', '.join(missing)} (every {family} config.json "
                          "has them)")
    refused: list[str] = []
    table = _dense(cfg, label, family, refused)
    if family in ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3"):
        table.update(_moe(cfg, label, family, refused))
    if family.startswith("deepseek"):
        table.update(_mla(cfg, label))
    if refused:
        raise ConfigError(f"{label}: cannot express {'; '.join(refused)}")
    unknown = tuple(sorted(k for k in cfg if k not in HARMLESS and k not in _READ))
    return HfModel(table=table, window=_window(cfg, label, family), unknown=unknown)


def _required(family: str) -> tuple[str, ...]:
    """The fields a family's config.json always holds, checked together (one line)."""
    dense = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size",
             "intermediate_size")
    moe = {"mixtral": ("num_local_experts", "num_experts_per_tok"),
           "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
           "deepseek_v2": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                           "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                           "v_head_dim"),
           }.get(family, ())
    if family == "deepseek_v3":
        moe = _required("deepseek_v2")[len(dense):]
    return (*dense, *moe)


def _get(cfg: Mapping[str, Any], name: str, label: str, default: Any = _REQUIRED) -> Any:
    """A field's value, or `default` where it is absent or null; a missing required field is
    one line."""
    value = cfg.get(name)
    if value is None:
        if default is _REQUIRED:
            raise ConfigError(f"{label}: {name}: missing (every {cfg.get('model_type')} "
                              "config.json has it)")
        return default
    return value


def _dense(cfg: Mapping[str, Any], label: str, family: str, refused: list[str]) -> dict[str, Any]:
    """The keys every family has: a pre-norm RMSNorm decoder with RoPE and a SwiGLU MLP."""
    heads = _get(cfg, "num_attention_heads", label)
    hidden = _get(cfg, "hidden_size", label)
    kv = _get(cfg, "num_key_value_heads", label, heads)
    act = _get(cfg, "hidden_act", label, "silu")
    if act != "silu":
        refused.append(f"hidden_act = {show(act)} (the gated MLP parasim models is SwiGLU: "
                       "\"silu\")")
    head_dim = _get(cfg, "head_dim", label, 0)
    biases = set()
    for name in ("attention_bias", "mlp_bias"):
        value = _get(cfg, name, label, False)
        if not isinstance(value, bool):
            raise ConfigError(f"{label}: {name}: {show(value)} must be true or false")
        biases.add(value)
    if len(biases) > 1:
        refused.append("attention_bias != mlp_bias (parasim's bias covers every linear layer)")
    return {
        "layers": _get(cfg, "num_hidden_layers", label), "hidden": hidden, "heads": heads,
        "kv_heads": 0 if kv == heads else kv, "vocab": _get(cfg, "vocab_size", label),
        "ffn": "swiglu", "ffn_hidden": _get(cfg, "intermediate_size", label),
        "norm": "rmsnorm", "position": "rope", "bias": True in biases,
        "tied_embeddings": _get(cfg, "tie_word_embeddings", label, False),
        "dropout": _get(cfg, "attention_dropout", label, 0.0),
        "head_dim": 0 if isinstance(head_dim, int) and isinstance(heads, int) and
        head_dim * heads == hidden else head_dim,
        "qk_norm": family.startswith("qwen3"), "seq_len": _context(cfg, label),
        **{key: 0 for key in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim",
                              "experts", "top_k", "moe_ffn_hidden", "shared_experts",
                              "dense_layers", "router_groups", "router_group_topk",
                              "mtp_layers")},
        "moe_router_score_function": "softmax", "moe_router_enable_expert_bias": False}


def _context(cfg: Mapping[str, Any], label: str) -> Any:
    """The sequence the model was pre-trained at: RoPE scaling's original context where the
    file extends it (DeepSeek-V3: 4,096 of 163,840), else max_position_embeddings."""
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("original_max_position_embeddings"):
        return scaling["original_max_position_embeddings"]
    return _get(cfg, "max_position_embeddings", label)


def _moe(cfg: Mapping[str, Any], label: str, family: str, refused: list[str]) -> dict[str, Any]:
    """Routed (and shared) experts, dense leading layers and group-limited routing."""
    if family == "mixtral":
        return {"experts": _get(cfg, "num_local_experts", label),
                "top_k": _get(cfg, "num_experts_per_tok", label)}
    if family == "qwen3_moe":
        if _get(cfg, "decoder_sparse_step", label, 1) != 1 or _get(cfg, "mlp_only_layers",
                                                                     label, []):
            refused.append("decoder_sparse_step/mlp_only_layers (MoE layers other than every "
                           "layer)")
        return {"experts": _get(cfg, "num_experts", label),
                "top_k": _get(cfg, "num_experts_per_tok", label),
                "moe_ffn_hidden": _get(cfg, "moe_intermediate_size", label)}
    if _get(cfg, "moe_layer_freq", label, 1) != 1:
        refused.append(f"moe_layer_freq = {show(cfg['moe_layer_freq'])} (parasim's MoE "
                       "layers are every layer after first_k_dense_replace)")
    method = _get(cfg, "topk_method", label, "greedy")
    grouped = method in ("group_limited_greedy", "noaux_tc") and \
        _get(cfg, "n_group", label, 1) != 1
    return {"experts": _get(cfg, "n_routed_experts", label),
            "top_k": _get(cfg, "num_experts_per_tok", label),
            "moe_ffn_hidden": _get(cfg, "moe_intermediate_size", label),
            "shared_experts": _get(cfg, "n_shared_experts", label, 0),
            "dense_layers": _get(cfg, "first_k_dense_replace", label, 0),
            "router_groups": cfg["n_group"] if grouped else 0,
            "router_group_topk": _get(cfg, "topk_group", label) if grouped else 0,
            "moe_router_score_function": _get(cfg, "scoring_func", label, "softmax"),
            "moe_router_enable_expert_bias": method == "noaux_tc",
            "mtp_layers": _get(cfg, "num_nextn_predict_layers", label, 0)}


def _mla(cfg: Mapping[str, Any], label: str) -> dict[str, Any]:
    """Multi-head latent attention: DeepSeek's ranks and head widths (`traces.mla`)."""
    return {"kv_heads": 0, "head_dim": _get(cfg, "qk_nope_head_dim", label),
            "q_lora_rank": _get(cfg, "q_lora_rank", label, 0),
            "kv_lora_rank": _get(cfg, "kv_lora_rank", label),
            "qk_rope_head_dim": _get(cfg, "qk_rope_head_dim", label),
            "v_head_dim": _get(cfg, "v_head_dim", label)}


def _window(cfg: Mapping[str, Any], label: str, family: str) -> int:
    """The sliding window's span, where the file's attention uses one: Mistral always when set,
    Qwen only with use_sliding_window."""
    window = cfg.get("sliding_window")
    if window is None or (family.startswith("qwen") and not cfg.get("use_sliding_window")):
        return 0
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ConfigError(f"{label}: sliding_window: {show(window)} must be a positive "
                          "integer or null")
    return window
