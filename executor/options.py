"""What a run may ask of the executor (`RunOptions`) and what it refuses to run
(`check_supported`): layouts it cannot run exactly, FP8 without its kernels, the MoE layouts
it does not run (`check_moe_supported`; ZeRO over an expert-DP group runs: ZeRO 1/2 in
`executor.experts`, ZeRO 3 in `executor.expert_fsdp`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from executor.optim import AdamWConfig
from traces.errors import ConfigError
from traces.layout import Layout
from traces.model import ModelSpec
from traces.ops import Trace


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    seed: int = 1234
    dropout: float = 0.0
    """The dropout the executor draws (0: none, so that a run's numbers equal a single
    process's); the plan's costs follow `ModelSpec.dropout`, which must then be > 0."""
    adamw: AdamWConfig = field(default_factory=AdamWConfig)
    clip_grad: float = 1.0
    """Clip the gradients to this global norm (Megatron-LM's --clip-grad, 1.0 by default)."""
    gpus_per_node: int = 8
    """The node (NVLink domain) a DeepEP/HybridEP dispatch forwards inside (`executor.hops`):
    on gloo, ranks r // gpus_per_node share a node; the cluster's when run from a config."""


def as_run(plan: Trace, options: RunOptions) -> Trace:
    """`plan` as the executor runs it: drawing no dropout (`options.dropout` 0, the default),
    its ops draw no random numbers, so a recorded trace says what ran and `calibrate` does
    not time draws that never happened (`sim.calibrate.kernels`)."""
    if options.dropout:
        return plan
    return Trace({rank: tuple(dataclasses.replace(op, draws=0.0) if op.draws else op
                              for op in ops) for rank, ops in plan.ops.items()}, plan.meta)


def check_supported(model: ModelSpec, layout: Layout, options: RunOptions | None = None
                    ) -> None:
    """Layouts the executor cannot run exactly; a ConfigError naming the rule."""
    if model.fp8:
        raise ConfigError(fp8_refusal(model.dtype))
    if layout.recompute == "selective_op":
        raise ConfigError("parallel.recompute: 'selective_op' (torchtitan's per-op rule) is "
                          "simulated, not run by the executor; use none, selective or full")
    if layout.recompute_modules or layout.fp8_activation_cache:
        raise ConfigError("parallel.recompute_modules: Megatron-Core's per-module "
                          "recomputation and the FP8 activation cache are simulated, not run "
                          "by the executor; leave them out to run")
    if layout.cpu_offloading_num_layers:
        raise ConfigError(f"parallel.cpu_offloading_num_layers: "
                          f"{layout.cpu_offloading_num_layers}: activation offloading's host "
                          "copies are simulated, not run by the executor; use 0 to run")
    if model.mtp_layers:
        raise ConfigError(f"model.mtp_layers: {model.mtp_layers}: multi-token prediction is "
                          "simulated, not run by the executor; use 0 to run")
    if model.experts:
        check_moe_supported(model, layout)
    if model.mla and (layout.sp or layout.cp > 1):
        raise ConfigError("parallel.sp: latent attention runs in the executor without SP and "
                          "CP (its gathered latents are not written yet); simulate it")
    if options is not None and options.dropout and not model.dropout:
        raise ConfigError(f"run: dropout {options.dropout:g} needs model.dropout > 0 (a model "
                          "without dropout runs no attention dropout kernel)")
    if layout.cp > 1 and options is not None and options.dropout:
        raise ConfigError("parallel.cp: the executor runs context parallelism without "
                          "dropout (its ring attention has none); use dropout = 0")
    if model.tied_embeddings and layout.pp > 1 and layout.zero >= 1 and layout.dp > 1:
        raise ConfigError("parallel.zero: tied embeddings with pp > 1 need the embedding "
                          "all-reduce before the DP reduction for ZeRO >= 1 (after a "
                          "reduce-scatter the two stages' shards of the word embeddings "
                          "differ); use zero = 0 or model.tied_embeddings = false")


def check_moe_supported(model: ModelSpec, layout: Layout) -> None:
    """What the executor's MoE layers (`executor.moe`) do not run; a ConfigError naming it."""
    rules = [
        (layout.etp > 1, f"parallel.etp: {layout.etp}: expert tensor parallelism is not "
                         "run by the executor; use etp = 1"),
        (model.shared_experts > 0, f"model.shared_experts: {model.shared_experts}: the "
                                   "executor runs routed experts only; use 0"),
        (model.bias, "model.bias: true: the executor's MoE layers have no biases; use false"),
        (not model.moe_grouped_gemm, "model.moe_grouped_gemm: false: the executor runs a "
                                     "grouped GEMM per distinct token count; use true"),
    ]
    for refused, message in rules:
        if refused:
            raise ConfigError(message)


def fp8_refusal(dtype: str = "fp8") -> str:
    """Why the executor does not run an fp8 (or fp4) model here: no FP8 GEMMs on a CPU; on a
    GPU, its FP8 kernels (Transformer Engine's casts, amax reduction) are not written yet."""
    if not torch.cuda.is_available():
        cores = "FP4 tensor cores (Blackwell)" if dtype == "fp4" else \
            "FP8 tensor cores (Hopper or Blackwell)"
        return (f"model.dtype: \"{dtype}\" needs {cores}; this "
                "run has no GPU, and gloo on CPU computes in fp32, bf16 or fp16 only")
    return (f"model.dtype: \"{dtype}\": the executor's {dtype.upper()} kernels (Transformer "
            "Engine's casts and amax reduction) are not implemented; simulate it, or run bf16")
