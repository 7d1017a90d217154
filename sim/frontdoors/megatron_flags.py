"""The Megatron-LM arguments parasim reads, each with the `[model]` or `[parallel]` key it sets,
and those it knows to change nothing a step does (`sim.frontdoors.megatron` uses them).

Names are Megatron-LM's (megatron/training/arguments.py); a Megatron-Bridge override
`section.field=value` (`model.tensor_model_parallel_size=4`) is read as the flag of the same
name (`--tensor-model-parallel-size 4`), Bridge's own field names in `ALIASES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from traces.errors import ConfigError, show


def _int(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{flag}: {show(text)} must be an integer") from None


def _float(flag: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{flag}: {show(text)} must be a number") from None


def _str(flag: str, text: str) -> str:
    return text


@dataclass(frozen=True)
class Flag:
    """A flag read: the (table, key) it sets and how its value is read; `value` None marks a
    switch (present: true), whose Bridge form may say true or false."""

    table: str
    key: str
    value: Callable[[str, str], Any] | None = None


def _m(key: str, value: Callable[[str, str], Any] | None = _int) -> Flag:
    return Flag("model", key, value)


def _p(key: str, value: Callable[[str, str], Any] | None = _int) -> Flag:
    return Flag("parallel", key, value)


FLAGS: Mapping[str, Flag] = {
    # the model
    "num-layers": _m("layers"), "hidden-size": _m("hidden"),
    "num-attention-heads": _m("heads"), "num-query-groups": _m("kv_heads"),
    "ffn-hidden-size": _m("ffn_hidden"), "seq-length": _m("seq_len"),
    "vocab-size": _m("vocab"), "kv-channels": _m("head_dim"), "qk-layernorm": _m("qk_norm", None),
    "swiglu": _m("ffn", None), "normalization": _m("norm", _str),
    "position-embedding-type": _m("position", _str),
    "disable-bias-linear": _m("bias", None),
    "untie-embeddings-and-output-weights": _m("tied_embeddings", None),
    "hidden-dropout": _m("dropout", _float), "attention-dropout": _m("dropout", _float),
    "q-lora-rank": _m("q_lora_rank"), "kv-lora-rank": _m("kv_lora_rank"),
    "qk-head-dim": _m("head_dim"), "qk-pos-emb-head-dim": _m("qk_rope_head_dim"),
    "v-head-dim": _m("v_head_dim"), "mtp-num-layers": _m("mtp_layers"),
    "num-experts": _m("experts"), "moe-router-topk": _m("top_k"),
    "moe-ffn-hidden-size": _m("moe_ffn_hidden"),
    "moe-shared-expert-intermediate-size": _m("shared_experts"),
    "moe-router-num-groups": _m("router_groups"),
    "moe-router-group-topk": _m("router_group_topk"),
    "moe-router-score-function": _m("moe_router_score_function", _str),
    "moe-router-enable-expert-bias": _m("moe_router_enable_expert_bias", None),
    "moe-grouped-gemm": _m("moe_grouped_gemm", None),
    "moe-permute-fusion": _m("moe_permute_fusion", None),
    "moe-router-fusion": _m("moe_router_fusion", None),
    "moe-expert-capacity-factor": _m("capacity_factor", _float),
    "moe-token-dispatcher-type": _m("dispatch", _str), "moe-enable-deepep": _m("dispatch", None),
    "moe-flex-dispatcher-backend": _m("dispatch", _str),
    "attention-backend": _m("attention", _str),
    "fp8-format": _m("dtype", _str), "fp8-recipe": _m("fp8_recipe", _str),
    "fp4-format": _m("dtype", _str), "fp4-recipe": _m("fp4_recipe", _str),
    "bf16": _m("dtype", None), "fp16": _m("dtype", None),
    # the layout
    "tensor-model-parallel-size": _p("tp"), "pipeline-model-parallel-size": _p("pp"),
    "context-parallel-size": _p("cp"), "cp-comm-type": _p("cp_comm", _str),
    "expert-model-parallel-size": _p("ep"), "expert-tensor-parallel-size": _p("etp"),
    "num-layers-per-virtual-pipeline-stage": _p("vp"),
    "virtual-pipeline-model-parallel-size": _p("vp"),
    "sequence-parallel": _p("sp", None), "use-distributed-optimizer": _p("zero", None),
    "micro-batch-size": _p("micro_batch"), "global-batch-size": _p("global_batch"),
    "recompute-granularity": _p("recompute", _str), "recompute-activations": _p("recompute", None),
    "pipeline-model-parallel-layout": _p("pipeline_layout", _str),
    "decoder-first-pipeline-num-layers": _p("pp_first_layers"),
    "decoder-last-pipeline-num-layers": _p("pp_last_layers"),
    "account-for-embedding-in-pipeline-split": _p("account_for_embedding", None),
    "account-for-loss-in-pipeline-split": _p("account_for_loss", None),
    "overlap-grad-reduce": _p("overlap_grad_reduce", None),
    "overlap-param-gather": _p("overlap_param_gather", None),
    "tp-comm-overlap": _p("tp_comm_overlap", None),
    "grad-reduce-in-fp32": _p("fp32_main_grads", None),
    "ddp-bucket-size": _p("bucket_bytes"),
    "overlap-moe-expert-parallel-comm": _p("overlap_moe_comm", None),
}
"""Every flag parasim reads (module docstring); `sim.frontdoors.megatron` turns the values
into keys (a switch's meaning, a virtual-pipeline size's arithmetic)."""
ALIASES: Mapping[str, str] = {
    "num-moe-experts": "num-experts", "fp8": "fp8-format", "fp4": "fp4-format",
    "seq-len": "seq-length",
    "accumulate-allreduce-grads-in-fp32": "grad-reduce-in-fp32",
}
"""Megatron-Bridge field names that differ from the Megatron-LM flag."""
HARMLESS = frozenset({
    # optimizer, schedule of the learning rate, initialisation, seeds
    "lr", "min-lr", "lr-decay-style", "lr-warmup-iters", "lr-warmup-samples",
    "lr-warmup-fraction", "lr-decay-iters", "lr-decay-samples", "weight-decay", "clip-grad",
    "adam-beta1", "adam-beta2", "adam-eps", "init-method-std", "seed", "optimizer",
    # how long, on what, saved where, logged how
    "train-iters", "train-samples", "eval-iters", "eval-interval", "save", "load",
    "save-interval", "data-path", "split", "tokenizer-type", "tokenizer-model", "vocab-file",
    "merge-file", "log-interval", "tensorboard-dir", "wandb-project", "wandb-exp-name",
    "log-throughput", "timing-log-level", "exit-duration-in-mins", "distributed-backend",
    "distributed-timeout-minutes", "data-cache-path", "num-workers", "mock-data",
    # shapes parasim derives or that change no step's work
    "max-position-embeddings", "make-vocab-size-divisible-by", "rotary-base",
    "rotary-percent", "norm-epsilon", "group-query-attention", "multi-latent-attention",
    "use-mcore-models", "transformer-impl", "use-flash-attn",
    "moe-aux-loss-coeff", "moe-router-load-balancing-type", "moe-router-topk-scaling-factor",
    "moe-router-bias-update-rate", "moe-router-dtype", "rope-type", "rotary-scaling-factor",
    "attention-softmax-in-fp32", "no-check-for-nan-in-loss-and-grad",
})
"""Flags that change nothing parasim simulates: read and left out without a word."""
