"""Published rows for `bench_recipes.py`: NVIDIA's Megatron-Bridge / NeMo performance summary.

The dense Llama 3 / 3.1 rows of the Megatron-Bridge "Performance" page (docs.nvidia.com/nemo/
megatron-bridge/latest/performance-summary.html and its archive page; the same tables in
NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md @df0289c and
docs/performance-summary-archive.md @0a25f91, read 2026-12-04): tokens/s/GPU as published, with
each row's GPUs, precision, GBS, MBS, sequence, FSDP, TP, PP, CP and VP. Precision: FP8-CS is
Transformer Engine's per-tensor current scaling ("scaling factors computed in the current
step", the NeMo 25.07 page) -> fp8_recipe "tensorwise"; FP8-MX is MXFP8 -> "mxfp8"; NVFP4 is
Megatron-Bridge's bf16_with_nvfp4_mixed (fp4 "e2m1", fp4_recipe "nvfp4", fp8_param_gather
False; the performance scripts' get_precision_config returns it unchanged, so no layer is kept
in bf16: scripts/performance/utils/precision.py @84fba28) -> dtype "fp4", fp4_recipe "nvfp4"
(traces/fp8_recipes.py: TE's NVFP4BlockScaling at the accelerator's dense FP4 rate). The pages
publish no BF16 rows for the dense Llamas.

What the table does not state is taken from the recipes' common settings, the same for every
row (Megatron-Bridge scripts/performance, as sim/examples/llama3-70b-h100.toml cites them):
sequence parallelism wherever TP > 1, the distributed optimizer (ZeRO-1; FSDP rows ZeRO-3),
no activation recomputation. Gradients reduced in bf16: the performance scripts' common
settings set `cfg.mixed_precision.grad_reduce_in_fp32 = False` and `cfg.ddp.grad_reduce_in_fp32
= False` (scripts/performance/configs/llama/llama3_llm_pretrain.py set_llama3_common_configs,
llama31_llm_pretrain.py set_llama31_common_configs). TP communication overlap wherever TP > 1:
the 70B and 405B recipes build `CommOverlapConfig(tp_comm_overlap=True, ...)` with a userbuffers
config per GPU (src/megatron/bridge/recipes/llama/llama3.py llama3_70b_pretrain_config,
llama31_405b_pretrain_config), the 8B scripts `tp_comm_overlap=bool(tp > 1)`; the distributed
optimizer's gradient reduce-scatter and parameter all-gather overlapped (`_pretrain_common`:
ddp.overlap_grad_reduce and ddp.overlap_param_gather True). Recipe details parasim has no key
for (CUDA graphs, recompute of 5 layers on the H100 8B row) are not modelled. What they and
CPU offloading change, by a stored version of the performance scripts' Llama 3 presets
(LLAMA3_70B_GB200_FP8_CS_BASE_CONFIG and its neighbours; that version states GBS 128 for 70B,
not the tables' 256): the 70B FSDP rows offload the activations of 40 of 80 layers to Grace
memory on GB200 and 20 on GB300 (cpu_offloading_num_layers: these rows set it; parasim times
the copies over NVLink-C2C, hidden under compute; with Transformer Engine's FP8 saved inputs
counted, traces/te_fp8_memory.py, GB300's fit, 272 of 288 GB, GB200's still not, 195 of
186 GB), and the GB200
8B FP8-CS row runs without the full-iteration CUDA graph that the B200, GB300 and GB200 MXFP8
rows capture: both are GB200's costs that these rows cannot state. 405B rows split 126
layers + embedding + loss evenly over PP x VP chunks (account_for_embedding /
account_for_loss, as the Llama 3.1 405B recipes set them). FP8 weights gathered in FP8
(fp8_param_gather): the scripts' get_precision_config takes Megatron-Bridge's
bf16_with_fp8_current_scaling_mixed (with first_last_layers_bf16 turned off) for FP8-CS and
bf16_with_mxfp8_mixed for FP8-MX, both fp8_param_gather = True (training/mixed_precision.py
@0509780; NVFP4's sets it False); the FSDP rows set it too, but parasim models it only with
the distributed optimizer (traces/fp8_params.py), so they go without.

Wherever the scripts use Megatron-FSDP they turn gradient accumulation fusion off
(`cfg.model.gradient_accumulation_fusion = False  # Disabled to avoid functional errors`,
scripts/performance/configs/llama/llama3_llm_pretrain.py: llama3_70b_gb200_config,
llama3_70b_gb300_config, llama3_8b_h100_config): the FSDP rows set
`gradient_accumulation_fusion = False`, so each unit's gradients are copied into Megatron-FSDP's
reduce-scatter bucket after its backward (traces/fsdp_kernels.py).

A GB200/GB300 job uses 64-GPU NVLink domains of an NVL72 rack ("place the sixteen four-GPU
nodes within one NVLink domain": Megatron-Bridge's GB200 Llama 3.1 405B recipe docstring), so
a "node" here is min(GPUs, 64) GPUs of the rack preset.
"""

from __future__ import annotations

from typing import Any

from recipes_rows import Row, llama

BRIDGE_2511 = ("Megatron-Bridge performance summary, 25.11 NeMo container "
               "(docs/performance-summary.md @df0289c)")
BRIDGE_2602 = ("Megatron-Bridge performance summary, 26.02 NeMo container (docs/"
               "performance-summary.md @df0289c and -archive.md @0a25f91 agree on this row)")

PRECISION = {"FP8-CS": {"dtype": "fp8", "fp8_recipe": "tensorwise"},
             "FP8-MX": {"dtype": "fp8", "fp8_recipe": "mxfp8"},
             "NVFP4": {"dtype": "fp4", "fp4_recipe": "nvfp4"}}
# cpu_offloading_num_layers of the 70B FSDP presets (LLAMA3_70B_GB200_FP8_CS_BASE_CONFIG and
# the GB300 one, in the stored version of the performance scripts the docstring cites).
OFFLOAD_70B_FSDP = {"GB200": 40, "GB300": 20}
SYSTEMS = {"H100": "dgx-h100", "B200": "dgx-b200", "GB200": "gb200-nvl72",
           "GB300": "gb300-nvl72"}


def cluster(system: str, gpus: int) -> dict[str, Any]:
    """The preset for a DGX system (8 GPUs a node) or an NVL72 rack (64-GPU domains)."""
    preset = SYSTEMS[system]
    if preset.endswith("nvl72"):
        per_node = min(gpus, 64)
        return {"preset": preset, "gpus_per_node": per_node, "nodes": gpus // per_node}
    return {"preset": preset, "nodes": gpus // 8}


def bridge(source: str, system: str, size: str, precision: str, gpus: int, gbs: int, mbs: int,
           layout: tuple[int, int, int, int, int], tokens: float) -> Row:
    """One row: `layout` is the page's (FSDP, TP, PP, CP, VP) columns, VP 1 for "n/a"."""
    fsdp, tp, pp, cp, vp = layout
    parallel: dict[str, Any] = {
        "tp": tp, "pp": pp, "cp": cp, "dp": gpus // (tp * pp * cp), "vp": vp,
        "schedule": "interleaved" if vp > 1 else "1f1b", "sp": tp > 1,
        "tp_comm_overlap": tp > 1, "overlap_param_gather": True,
        "zero": 3 if fsdp else 1, "fp32_main_grads": False, "recompute": "none",
        "micro_batch": mbs, "global_batch": gbs,
    }
    if not fsdp and precision in ("FP8-CS", "FP8-MX"):
        parallel["fp8_param_gather"] = True  # the recipes' precision configs (docstring)
    if fsdp:  # the scripts' Megatron-FSDP settings (docstring)
        parallel["gradient_accumulation_fusion"] = False
    if fsdp and size == "70b" and system in OFFLOAD_70B_FSDP:
        parallel["cpu_offloading_num_layers"] = OFFLOAD_70B_FSDP[system]
    if size == "405b":
        parallel.update(account_for_embedding=True, account_for_loss=True)
    release = "25.11" if source == BRIDGE_2511 else "26.02"
    name = f"{release} {size.upper()} {system} {precision}, {gpus} GPUs" + (
        " FSDP" if fsdp else "")
    return Row("bridge", name, source, llama(size, 8192, **PRECISION[precision]), parallel,
               cluster(system, gpus), tokens, "tokens/s")


def published_pair(system: str, size: str, precision: str, gpus: int, gbs: int, mbs: int,
                   layout: tuple[int, int, int, int, int], tokens: float,
                   tflops: float) -> tuple[Row, float]:
    """A 25.11 row with its published Model TFLOP/s/GPU too (the FLOP-count check)."""
    return bridge(BRIDGE_2511, system, size, precision, gpus, gbs, mbs, layout, tokens), tflops


# 25.11 NeMo container: every dense Llama row, FP8-CS and (in parentheses) FP8-MX.
PAIRS_2511: list[tuple[Row, float]] = [
    published_pair("GB300", "8b", "FP8-CS", 8, 128, 2, (0, 1, 1, 1, 1), 37556, 1933),
    published_pair("GB300", "8b", "FP8-MX", 8, 128, 2, (0, 1, 1, 1, 1), 36108, 1858),
    published_pair("GB300", "70b", "FP8-CS", 64, 256, 2, (1, 1, 1, 1, 1), 4520, 2030),
    published_pair("GB300", "405b", "FP8-CS", 256, 1536, 1, (0, 2, 8, 2, 4), 999, 2522),
    published_pair("GB200", "8b", "FP8-CS", 8, 128, 2, (0, 1, 1, 1, 1), 31508, 1622),
    published_pair("GB200", "8b", "FP8-MX", 8, 128, 2, (0, 1, 1, 1, 1), 29789, 1533),
    published_pair("GB200", "70b", "FP8-CS", 64, 256, 2, (1, 1, 1, 1, 1), 4312, 1937),
    published_pair("GB200", "405b", "FP8-CS", 256, 1536, 1, (0, 4, 16, 1, 4), 813, 2053),
    published_pair("B200", "8b", "FP8-CS", 8, 128, 2, (0, 1, 1, 1, 1), 30624, 1576),
    published_pair("B200", "8b", "FP8-MX", 8, 128, 2, (0, 1, 1, 1, 1), 29521, 1519),
    published_pair("B200", "405b", "FP8-CS", 128, 64, 1, (0, 4, 8, 2, 8), 661, 1667),
    published_pair("B200", "405b", "FP8-MX", 128, 64, 1, (0, 4, 8, 2, 8), 624, 1576),
    published_pair("H100", "8b", "FP8-CS", 8, 128, 1, (1, 1, 1, 1, 1), 14451, 744),
    published_pair("H100", "70b", "FP8-CS", 64, 128, 1, (0, 4, 8, 1, 5), 1602, 719),
    published_pair("H100", "405b", "FP8-CS", 1024, 512, 1, (0, 8, 8, 2, 8), 292, 737),
]

# 26.02 NeMo container: the dense Llama rows on which both stored versions of the page agree
# (GB200 70B MXFP8 and NVFP4, GB300 405B NVFP4 differ between them and are left out).
ROWS_2602: list[Row] = [
    bridge(BRIDGE_2602, "GB300", "70b", "FP8-CS", 64, 256, 2, (1, 1, 1, 1, 1), 5003),
    bridge(BRIDGE_2602, "GB300", "70b", "FP8-MX", 64, 256, 1, (0, 1, 4, 1, 5), 4596),
    bridge(BRIDGE_2602, "GB300", "70b", "NVFP4", 64, 256, 1, (0, 1, 4, 1, 5), 6798),
    bridge(BRIDGE_2602, "GB200", "70b", "FP8-CS", 64, 256, 2, (1, 1, 1, 1, 1), 4040),
    bridge(BRIDGE_2602, "H100", "70b", "FP8-CS", 64, 256, 1, (0, 4, 8, 1, 5), 1621),
    bridge(BRIDGE_2602, "GB300", "405b", "FP8-CS", 256, 1536, 1, (0, 4, 8, 1, 4), 988),
    bridge(BRIDGE_2602, "GB300", "405b", "FP8-MX", 256, 1536, 1, (0, 2, 8, 2, 4), 931),
    bridge(BRIDGE_2602, "GB200", "405b", "FP8-CS", 256, 1536, 1, (0, 4, 16, 1, 4), 793),
    bridge(BRIDGE_2602, "GB200", "405b", "FP8-MX", 256, 1536, 1, (0, 4, 16, 1, 8), 786),
    bridge(BRIDGE_2602, "H100", "405b", "FP8-CS", 1024, 1536, 1, (0, 8, 8, 2, 8), 311),
]

BRIDGE_ROWS: list[Row] = [row for row, _ in PAIRS_2511] + ROWS_2602
